// A non-owning reference to a callable: like std::function without the heap allocation,
// so the thread pool can run lambdas inside the training step without allocating.
#pragma once
#include <type_traits>
#include <utility>

namespace bagualu {

template <typename Sig>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
   public:
    FunctionRef() = default;
    template <typename F,
              typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
    FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): implicit by design
        : obj_(const_cast<void*>(static_cast<const void*>(&f))),
          call_([](void* o, Args... args) -> R {
              return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
          }) {}
    R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }
    explicit operator bool() const { return call_ != nullptr; }

   private:
    void* obj_                 = nullptr;
    R (*call_)(void*, Args...) = nullptr;
};

}  // namespace bagualu
