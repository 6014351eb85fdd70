// A graceful stop on a signal: SIGINT (Ctrl-C), SIGTERM (what Slurm and most schedulers send
// before they kill a job) and SIGUSR1 (what mpirun forwards to every rank without ending the job,
// and what `sbatch --signal=USR1@SECONDS` sends ahead of the time limit). The handler only notes
// the signal; the trainer reads it at each step's end, agrees on it over the ranks, and stops
// there with a checkpoint (train/trainer.cpp). After the first, the three signals get their
// default action back, so a second one ends the process at once.
#pragma once

namespace bagualu {

// Installs the handlers (once per process; later calls do nothing): for SIGUSR1, and for SIGINT
// and SIGTERM unless usr1_only (under a launcher that ends the job on those itself: a rank that
// held on to them would outlive a job its launcher is ending).
void install_stop_handlers(bool usr1_only = false);

// The default action back for the three signals: for a process that is failing anyway, so that
// the launcher's SIGTERM ends it as it would have without the handlers.
void restore_default_stop_handlers();

// The first of those signals this process received since install_stop_handlers, or 0.
int stop_signal();

// "SIGINT", "SIGTERM", "SIGUSR1", else "a signal".
const char* signal_name(int sig);

}  // namespace bagualu
