// Linked into every test executable: the MPI jobs a test process starts (mpirun, and the
// singleton MPI_Init of a `bagualu` run without it) keep their OpenMPI session directory under a
// base of this process's own, not under the shared /tmp/ompi.<host>.<uid>.
//
// Why: ctest -j runs several test processes at once, each starting jobs. A job that ends removes
// the shared /tmp/ompi.<host>.<uid> once its own pid.N below it is gone; a job starting at that
// moment has just found that directory and then fails in orte_init with "mkdir
// /tmp/ompi.<host>.<uid>/pid.N: No such file or directory". Within one test process the jobs run
// one after another, so one base per process is enough. OpenMPI creates the base (as mkdir -p)
// and removes its session tree below it at the end of each job; the process removes the empty
// base when it exits.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

class OwnSessionDir {
   public:
    OwnSessionDir() {
        // Set by the caller (ctest's mpi_np* tests set one per test; mpirun passes it to ranks).
        if (std::getenv("OMPI_MCA_orte_tmpdir_base") != nullptr) return;
        std::error_code ec;
        const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
        base_                           = (ec ? std::filesystem::path("/tmp") : tmp) /
                ("bagualu-ompi-" + std::to_string(::getpid()));
        ::setenv("OMPI_MCA_orte_tmpdir_base", base_.c_str(), 1);
    }
    ~OwnSessionDir() {
        if (base_.empty()) return;
        std::error_code ec;
        std::filesystem::remove_all(base_, ec);
    }
    OwnSessionDir(const OwnSessionDir&)            = delete;
    OwnSessionDir& operator=(const OwnSessionDir&) = delete;

   private:
    std::filesystem::path base_;
};

const OwnSessionDir own_session_dir;

}  // namespace
