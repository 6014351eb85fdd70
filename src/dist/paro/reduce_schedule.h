// When each unit of gradient reduction runs (docs/parallelism.md, "Overlap of gradient reduction
// with backward"). A unit (an all-reduce of one run of tensors, or one ParO bucket) touches only
// gradient floats at or above its ready point, the lowest flat float it reads or writes; it may
// start once backward has finished every float from there to the end of the array. Backward goes
// from the last block to the first and reports how far it got (grads_ready), so the late layers'
// units start first. Units always run in the same order (descending ready point, then index) and
// with the same arithmetic: on the helper thread while backward goes on (overlap), or inline when
// the optimizer steps (no helper, or nothing was started during backward). Hence bitwise the same
// results either way; only the timing differs. On the helper, MPI waits sleep between polls
// (dist::set_gentle_waits) instead of spinning on the core backward needs.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "core/helper_thread.h"
#include "dist/comm/comm.h"

namespace bagualu::dist::paro {

class ReduceSchedule {
   public:
    // run(unit, on_helper): does unit's reduction; on_helper says it runs on the helper thread
    // (it must then use no compute-pool kernels). ready[i]: unit i's ready point. helper:
    // nullptr for no overlap.
    ReduceSchedule(std::vector<size_t> ready, HelperThread* helper,
                   std::function<void(size_t unit, bool on_helper)> run);
    ReduceSchedule(const ReduceSchedule&)            = delete;
    ReduceSchedule& operator=(const ReduceSchedule&) = delete;

    bool overlapped() const { return helper_ != nullptr; }
    // Between begin() and finish() with a helper: units may be running.
    bool armed() const { return armed_; }
    // Before the last backward of a step: its grads_ready calls start units on the helper.
    void begin();
    // Backward has finished every gradient float from `from` to the end of the array.
    void grads_ready(size_t from);
    // Runs what is left (inline without begin(), else starts it on the helper) and waits for
    // every unit. Returns the seconds spent here: the reduction time backward did not hide.
    double finish();
    // Waits for units still running on the helper, ignoring their errors (for destructors:
    // the units use the optimizer's buffers).
    void drain() noexcept;

   private:
    struct Job {
        ReduceSchedule* self = nullptr;
        size_t unit          = 0;
        void operator()() const {
            dist::set_gentle_waits(true);  // leave the core to backward while waiting for MPI
            self->run_(unit, true);
        }
    };
    void submit_next();

    std::vector<size_t> ready_;
    std::vector<size_t> order_;  // units by descending ready point
    std::vector<Job> jobs_;      // [unit], referenced by queued jobs
    HelperThread* helper_;
    std::function<void(size_t, bool)> run_;
    bool armed_                = false;
    size_t next_               = 0;  // into order_: first unit not started
    HelperThread::Ticket last_ = 0;
};

}  // namespace bagualu::dist::paro
