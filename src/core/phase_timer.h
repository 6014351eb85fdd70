// Where the time of a training step goes: PhaseScope lines in the model, the MoE layer and the
// trainer add their wall time (steady_clock) into one slot per Phase. Scopes nest exclusively:
// an inner scope pauses the outer one, so no time counts twice, and time outside every scope is
// "other" (step time minus the phases). Off unless enable_phase_timer(true) (bagualu bench
// train): a disabled scope is one predictable branch. Main thread only; not thread-safe.
#pragma once
#include <array>
#include <chrono>
#include <cstddef>

namespace bagualu {

// data: the data loader's next() (waiting for the prefetch, the readers' scatter, the copy).
enum class Phase { attention, mlp, experts, gate_dispatch, lm_head, optimizer, data };
inline constexpr size_t kNumPhases                               = 7;
inline constexpr std::array<const char*, kNumPhases> kPhaseNames = {
    "attention", "mlp", "experts", "gate_dispatch", "lm_head", "optimizer", "data"};

namespace phase_timer_detail {
using Clock = std::chrono::steady_clock;
struct State {
    bool enabled = false;
    int current  = -1;                         // index of the open phase, -1: none
    Clock::time_point since;                   // when `current` last started or resumed
    std::array<double, kNumPhases> seconds{};  // [Phase]
    double recompute = 0;                      // RecomputeScope seconds
};
inline State g_state;
}  // namespace phase_timer_detail

inline void enable_phase_timer(bool on) { phase_timer_detail::g_state.enabled = on; }
// Zeroes the totals (open scopes keep running and count from now on).
inline void reset_phase_timer() {
    auto& s = phase_timer_detail::g_state;
    s.seconds.fill(0.0);
    s.recompute = 0;
    s.since     = phase_timer_detail::Clock::now();
}
// Seconds spent in each phase since the last reset: [Phase].
inline const std::array<double, kNumPhases>& phase_seconds() {
    return phase_timer_detail::g_state.seconds;
}

class PhaseScope {
   public:
    explicit PhaseScope(Phase p) {
        if (phase_timer_detail::g_state.enabled) [[unlikely]]
            start(static_cast<int>(p));
    }
    ~PhaseScope() { stop(); }
    PhaseScope(const PhaseScope&)            = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

    // Ends the scope early; the destructor then does nothing.
    void stop() {
        if (!active_) return;
        auto& s = phase_timer_detail::g_state;
        charge(s);
        s.current = prev_;
        active_   = false;
    }

   private:
    static void charge(phase_timer_detail::State& s) {
        const auto now = phase_timer_detail::Clock::now();
        if (s.current >= 0) {
            s.seconds[static_cast<size_t>(s.current)] +=
                std::chrono::duration<double>(now - s.since).count();
        }
        s.since = now;
    }
    void start(int p) {
        auto& s = phase_timer_detail::g_state;
        charge(s);
        prev_     = s.current;
        s.current = p;
        active_   = true;
    }
    bool active_ = false;
    int prev_    = -1;
};

// The forward work backward runs again (train.recompute, model/gpt.h), timed across the phases
// rather than as one: its attention, experts, ... time stays in those phases, and this sums
// the whole of it on the side. Seconds since the last reset.
inline double recompute_seconds() { return phase_timer_detail::g_state.recompute; }
class RecomputeScope {
   public:
    RecomputeScope() : active_(phase_timer_detail::g_state.enabled) {
        if (active_) [[unlikely]]
            since_ = phase_timer_detail::Clock::now();
    }
    ~RecomputeScope() {
        if (active_) [[unlikely]] {
            phase_timer_detail::g_state.recompute +=
                std::chrono::duration<double>(phase_timer_detail::Clock::now() - since_).count();
        }
    }
    RecomputeScope(const RecomputeScope&)            = delete;
    RecomputeScope& operator=(const RecomputeScope&) = delete;

   private:
    bool active_;
    phase_timer_detail::Clock::time_point since_;
};

}  // namespace bagualu
