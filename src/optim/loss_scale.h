// Dynamic loss scaling for fp16 training: the loss (hence every gradient) is multiplied by
// scale() so small gradients survive fp16's range; the optimizer divides it out. A step whose
// gradients overflowed (inf or NaN) is skipped and the scale backs off; after `window` clean
// steps in a row it grows. Keys: precision.loss_scale, loss_scale_window, loss_scale_growth,
// loss_scale_backoff (config/config.h). A disabled scaler stays at 1.
#pragma once
#include <cstdint>

#include "config/config.h"

namespace bagualu::optim {

class LossScaler {
   public:
    LossScaler() = default;
    LossScaler(const PrecisionSection& p, bool enabled)
        : enabled_(enabled),
          scale_(enabled ? p.loss_scale : 1.0),
          growth_(p.loss_scale_growth),
          backoff_(p.loss_scale_backoff),
          window_(p.loss_scale_window) {}

    bool enabled() const { return enabled_; }
    double scale() const { return scale_; }
    // After each optimizer step: whether it was skipped for an inf/NaN gradient.
    void update(bool skipped) {
        if (!enabled_) return;
        if (skipped) {
            scale_ *= backoff_;
            clean_ = 0;
        } else if (++clean_ >= window_) {
            scale_ *= growth_;
            clean_ = 0;
        }
    }

    // Clean steps since the last change of scale; restore() resumes both (checkpoints).
    int64_t clean_steps() const { return clean_; }
    void restore(double scale, int64_t clean_steps) {
        if (!enabled_) return;
        scale_ = scale;
        clean_ = clean_steps;
    }

   private:
    bool enabled_ = false;
    double scale_ = 1, growth_ = 2, backoff_ = 0.5;
    int64_t window_ = 1000, clean_ = 0;
};

}  // namespace bagualu::optim
