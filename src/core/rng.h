// Deterministic random numbers, identical on every platform and standard library
// (std::normal_distribution is not: its algorithm is implementation-defined).
// Seeds derive from (seed, stream) with splitmix64; the generator is xoshiro256**.
#pragma once
#include <cmath>
#include <cstdint>

namespace bagualu {

inline uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z          = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z          = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

class Rng {
   public:
    explicit Rng(uint64_t seed, uint64_t stream = 0) {
        uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
        for (auto& w : s_) w = splitmix64(x);
    }
    uint64_t next_u64() {
        const uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const uint64_t t      = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
    // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias < 2^-64 * n, negligible).
    uint64_t below(uint64_t n) {
        __extension__ typedef unsigned __int128 u128;
        return static_cast<uint64_t>((static_cast<u128>(next_u64()) * n) >> 64);
    }
    // Standard normal by Box-Muller (one value per call; the pair's second value is dropped
    // so the sequence does not depend on call parity).
    double normal() {
        double u1 = uniform();
        double u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }

   private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

}  // namespace bagualu
