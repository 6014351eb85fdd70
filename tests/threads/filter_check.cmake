# Every pattern of the `threads` filter (CMakeLists.txt, BGL_THREADED_TESTS) names at least one
# test that threads_tests holds: a pattern whose test lives in a file left out of
# BGL_THREADED_TEST_SOURCES would otherwise run nothing under TSan, and nothing would say so.
#   cmake -DTESTS=<threads_tests binary> "-DPATTERNS=a.*;b.c" -P filter_check.cmake
set(missing "")
foreach(pattern IN LISTS PATTERNS)
  execute_process(COMMAND ${TESTS} --gtest_list_tests --gtest_filter=${pattern}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TESTS} --gtest_list_tests: exit ${rc}\n${out}")
  endif()
  # gtest lists each test indented under its suite (a parameterized suite as Prefix/Suite.)
  if(NOT out MATCHES "\n  [A-Za-z0-9_/]")
    list(APPEND missing ${pattern})
  endif()
endforeach()
if(missing)
  list(JOIN missing ", " missing)
  message(FATAL_ERROR "the threads filter's patterns ${missing} match no test of threads_tests: "
    "a parameterized suite is named Prefix/Suite, and a test's file must be in "
    "BGL_THREADED_TEST_SOURCES (CMakeLists.txt)")
endif()
list(LENGTH PATTERNS n)
message("each of the ${n} patterns matches a test")
