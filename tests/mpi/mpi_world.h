// The world Comm of the mpi_tests binary, created by mpi_main.cpp before any test runs: MpiComm
// under mpirun, LocalComm when the binary is run directly (then only MpiLaunch.* is meaningful).
#pragma once
#include "dist/comm/comm.h"

namespace bagualu::dist {

Comm& test_world();

}  // namespace bagualu::dist
