# The threads of a single-process training run, for TSan (ctest -L threads in a
# BGL_SANITIZE=thread build): the thread pool, the loader's prefetch on the I/O helper thread
# and asynchronous checkpoints (snapshot, background write, commit, prune), then a resume from
# the newest checkpoint. Without mpirun `train` never starts MPI. Fails on any non-zero exit,
# which a TSan report (halt_on_error=1) causes.
#   cmake -DBAGUALU=<bagualu binary> -DWORK=<scratch dir> -P train_checkpoint.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(data --set data.train=${WORK}/train.bin --set data.val=${WORK}/val.bin
  --set data.tokenizer=${WORK}/tok.model)
set(common --config configs/tiny.toml ${data} --set train.threads=2 --set sample.n_samples=0
  --set train.eval_every=4 --set train.eval_batches=1 --set checkpoint.every=2
  --set checkpoint.keep=2 --run-dir ${WORK}/run)

function(run)
  execute_process(COMMAND ${BAGUALU} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "bagualu ${ARGN}: exit ${rc}")
  endif()
endfunction()

run(prepare --config configs/tiny.toml ${data})
run(train ${common} --force --set train.steps=6)
run(train ${common} --resume --set train.steps=10)
if(NOT EXISTS ${WORK}/run/checkpoints)
  message(FATAL_ERROR "no checkpoint directory under ${WORK}/run")
endif()
file(REMOVE_RECURSE ${WORK})
