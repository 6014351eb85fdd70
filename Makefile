# Thin wrapper over CMake. `make train` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
JOBS      ?= $(shell nproc)
CONFIG    ?= configs/default.toml
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

DEB_PACKAGES := build-essential cmake pkg-config git \
	libopenmpi-dev openmpi-bin libsentencepiece-dev libtomlplusplus-dev libcli11-dev \
	nlohmann-json3-dev libfmt-dev libxxhash-dev zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev \
	libdnnl-dev libopenblas-dev libhwloc-dev fortunes fortunes-zh procps
FUZZ_PACKAGES := clang libclang-rt-dev
FORMAT_PACKAGES := clang-format

.PHONY: deps deps-fuzz deps-format configure build build-bin train test test-all prepare clean \
	format format-check test-asan test-tsan fuzz

# $(call install_missing,PACKAGES): apt-get install of those not installed yet, so a second
# run is quiet and fast.
define install_missing
@missing=$$(for p in $(1); do \
	dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
if [ -n "$$missing" ]; then \
	echo "make deps: installing $$missing"; \
	$(SUDO) apt-get update -q && \
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
fi
endef

deps:
	$(call install_missing,$(DEB_PACKAGES))

# clang and its libFuzzer runtime, for `make fuzz` only (the project itself builds with GCC).
deps-fuzz: deps
	$(call install_missing,$(FUZZ_PACKAGES))

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null

# Everything, tests included.
build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The bagualu binary alone (what `make train` needs).
build-bin: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target bagualu

prepare: build-bin
	$(BUILD_DIR)/bagualu prepare --config $(CONFIG)

train: prepare
	$(BUILD_DIR)/bagualu train --config $(CONFIG) --force

# The whole suite except tests labelled `slow`.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE slow

test-all: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# ---- sanitizers and fuzzing (each in a build directory of its own; .ci/run runs them all) ----
ASAN_DIR     ?= build-asan
TSAN_DIR     ?= build-tsan
FUZZ_DIR     ?= build-fuzz
FUZZ_SECONDS ?= 12
# LeakSanitizer: what OpenMPI and the libraries below it keep until exit is suppressed by
# library in .ci/lsan.supp; anything allocated by our code still fails. fast_unwind_on_malloc=0:
# OpenMPI is built without frame pointers, so only the slow unwinder reaches its frames (and
# past its unloaded plugins) for the suppressions to match. UBSan is fatal (compiled with
# -fno-sanitize-recover; halt_on_error says so again for the runtime).
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/.ci/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
TSAN_ENV := TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

# ASan + UBSan over the unit, cli and mpi suites; not `slow` (among them the planner's
# comparison with measured peak RSS, which ASan's allocator and shadow memory change; the unit
# test that counts bytes through mallinfo2 skips itself) nor `moda` (whole mpirun training
# runs, minutes each under ASan; CI has no room for them). With them:
# make test-asan ASAN_LABELS='unit|cli|mpi|moda'
ASAN_LABELS ?= unit|cli|mpi
# the test executables of those labels only: each label is its folder's suite, <label>_tests
# (CMakeLists.txt), so a label without a suite stops the build naming the missing target
ASAN_TARGETS = $(addsuffix _tests,$(subst |, ,$(ASAN_LABELS)))
test-asan: deps
	@cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=Release -DBGL_SANITIZE=address $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS) --target bagualu $(ASAN_TARGETS)
	cd $(ASAN_DIR) && $(SAN_ENV) ctest --output-on-failure -j $(JOBS) -L '$(ASAN_LABELS)'

# TSan over the threaded parts without MPI (ctest label `threads`, CMakeLists.txt): OpenMPI's
# progress threads are not instrumented, so TSan cannot see the synchronisation inside it and
# would report its hand-offs as races. Without MPI the threaded parts give no report, so there
# is no suppression file; should a third-party library need one, it goes in .ci/tsan.supp by
# library (TSAN_OPTIONS=suppressions=...), never our code. setarch -R: TSan's fixed memory
# layout clashes with high mmap randomisation on recent kernels.
test-tsan: deps
	@cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=Release -DBGL_SANITIZE=thread $(CMAKE_ARGS) >/dev/null
	@cmake --build $(TSAN_DIR) -j $(JOBS) --target bagualu threads_tests
	cd $(TSAN_DIR) && $(TSAN_ENV) setarch $$(uname -m) -R ctest --output-on-failure -j $(JOBS) -L threads

# Every fuzz target (fuzz/), built with clang, for FUZZ_SECONDS each from its seed corpus.
fuzz: deps-fuzz
	@cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Release -DBGL_FUZZ=ON -DBGL_FUZZ_SECONDS=$(FUZZ_SECONDS) \
		-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang $(CMAKE_ARGS) >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_smoke

# ---- the code style: .clang-format (Google-based, 4 spaces, 100 columns) over every tracked
# C++ file; format-check (.ci/run) fails naming each file that differs and each line past 100
# columns (the tensor table's rows included, which clang-format leaves as written) ----
SOURCES = $$(git ls-files '*.h' '*.cpp')
deps-format:
	$(call install_missing,$(FORMAT_PACKAGES))

format: deps-format
	clang-format -i $(SOURCES)

format-check: deps-format
	@clang-format --dry-run -Werror $(SOURCES)
	@! LC_ALL=C.UTF-8 grep -nP '^.{101,}' $(SOURCES) | sed 's/^\([^:]*:[0-9]*\):.*/\1: over 100 columns/' | grep .
	@echo "format-check: $$(git ls-files '*.h' '*.cpp' | wc -l) files in the style of .clang-format"

clean:
	rm -rf $(BUILD_DIR)
