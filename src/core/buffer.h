// Buffer<T>: an owning, 64-byte aligned, zero-initialised array. Move-only. The unit of memory
// for parameters, gradients, optimizer state and activations; allocated at start-up, never in
// the step loop.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace bagualu {

inline constexpr size_t kAlign = 64;

// std::allocator with kAlign-byte alignment: for grow-only scratch vectors whose rows a kernel
// reads where they lie a cache line at a time (kernels/mixed.cpp's 16-bit operand copies).
template <typename T>
struct AlignedAllocator {
    using value_type   = T;
    AlignedAllocator() = default;
    template <typename U>
    AlignedAllocator(const AlignedAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
    T* allocate(size_t n) {
        return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kAlign}));
    }
    void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{kAlign}); }
    template <typename U>
    bool operator==(const AlignedAllocator<U>&) const {
        return true;
    }
};
template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

template <typename T>
class Buffer {
   public:
    Buffer() = default;
    explicit Buffer(size_t n) : size_(n) {
        if (n == 0) return;
        const size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
        data_              = static_cast<T*>(std::aligned_alloc(kAlign, bytes));
        if (!data_) throw std::bad_alloc();
        std::memset(static_cast<void*>(data_), 0, bytes);
    }
    ~Buffer() { std::free(data_); }
    Buffer(Buffer&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    Buffer& operator=(Buffer&& o) noexcept {
        if (this != &o) {
            std::free(data_);
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    Buffer(const Buffer&)            = delete;
    Buffer& operator=(const Buffer&) = delete;

    T* data() { return data_; }
    const T* data() const { return data_; }
    size_t size() const { return size_; }
    T& operator[](size_t i) { return data_[i]; }
    const T& operator[](size_t i) const { return data_[i]; }
    void zero() {
        if (data_) std::memset(static_cast<void*>(data_), 0, size_ * sizeof(T));
    }

   private:
    T* data_     = nullptr;
    size_t size_ = 0;
};

// Hands out 64-byte aligned slices of one Buffer<float>: plan with reserve() calls, then
// allocate() once, then take() the slices in the same order. A slice may hold 16-bit values
// instead (reserve_half, at_half), used only as such.
class FloatArena {
   public:
    // Returns the offset of a new slice of n floats.
    size_t reserve(size_t n) {
        const size_t off = total_;
        total_ +=
            (n + kAlign / sizeof(float) - 1) / (kAlign / sizeof(float)) * (kAlign / sizeof(float));
        return off;
    }
    // A slice of n 16-bit values, in the room of (n + 1) / 2 floats.
    size_t reserve_half(size_t n) { return reserve((n + 1) / 2); }
    void allocate() { buf_ = Buffer<float>(total_); }
    float* at(size_t offset) { return buf_.data() + offset; }
    uint16_t* at_half(size_t offset) { return reinterpret_cast<uint16_t*>(at(offset)); }
    size_t total_floats() const { return total_; }

   private:
    size_t total_ = 0;
    Buffer<float> buf_;
};

}  // namespace bagualu
