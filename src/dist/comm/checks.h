// Start-up consistency checks that end every rank together instead of letting some ranks hang in
// a collective that others never reach. Both are collective over `comm` (use the world) and on
// failure print exactly one line to stderr and exit every process with status 2.
// A rank that dies on its own (crash, exit without MPI_Finalize) is handled by the launcher:
// OpenMPI's mpirun kills the remaining ranks and returns non-zero (tested in tests/mpi).
#pragma once
#include <cstdint>
#include <string>

#include "core/function_ref.h"
#include "dist/comm/comm.h"

namespace bagualu::dist {

// Every rank passes a hash of something that must agree (resolved config, data files, build).
// On mismatch rank 0 prints "error: <what> differs across ranks: ..." naming the ranks whose hash
// differs from rank 0's.
void check_same_everywhere(Comm& comm, uint64_t hash, const std::string& what);

// Every rank passes whether its own input checks passed. If any failed, the lowest failing rank
// prints "error: <its error>" and every rank exits with status 2.
void check_all_ok(Comm& comm, bool ok, const std::string& error);

// The same for a job of any size, error "" meaning this rank is fine: with one process a
// failure is thrown as InputError (its caller prints it), with several every rank ends with the
// lowest failing rank's message.
void fail_together(Comm& comm, const std::string& error);

// Runs `check` (input checks) on this rank, then fail_together with its InputError's message, if
// any: every rank calls it, and a rank with nothing to check passes a check that does nothing.
void check_together(Comm& comm, FunctionRef<void()> check);

}  // namespace bagualu::dist
