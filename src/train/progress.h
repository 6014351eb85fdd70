// What a person watching training sees: on a terminal, one live line rewritten in place
// (step/total, loss, tokens/s, MFU, ETA); elsewhere (logs, CI, mpirun jobs), plain lines.
#pragma once
#include <cstdint>
#include <string>

namespace bagualu::train {

class Progress {
   public:
    enum class Mode { Auto, Live, Lines, Quiet };
    explicit Progress(Mode mode);
    void update(int64_t step, int64_t total, double loss, double tokens_per_s, double mfu,
                double eta_s);
    // A line that stays (evaluation results, notices).
    void message(const std::string& line);
    void finish();

   private:
    Mode mode_;
    bool live_line_ = false;  // a live line is on screen without a newline
};

std::string format_duration(double seconds);

}  // namespace bagualu::train
