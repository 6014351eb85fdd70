// bf16 conversions: round to nearest even, NaN and infinity preserved, bf16 -> float exact.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

namespace bagualu {
namespace {

bf16 from_bits(uint32_t u) { return bf16_from_float(std::bit_cast<float>(u)); }

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(from_bits(0x3f800000u), 0x3f80);  // 1.0 exact
    EXPECT_EQ(from_bits(0x3f807fffu), 0x3f80);  // below half: down
    EXPECT_EQ(from_bits(0x3f808000u), 0x3f80);  // tie, even below: down
    EXPECT_EQ(from_bits(0x3f818000u), 0x3f82);  // tie, odd below: up
    EXPECT_EQ(from_bits(0x3f808001u), 0x3f81);  // above half: up
    EXPECT_EQ(from_bits(0xbf808001u), 0xbf81);  // sign symmetric
    EXPECT_EQ(from_bits(0x7f7fffffu), 0x7f80);  // max float rounds to +inf
}

TEST(Bf16, SpecialValues) {
    EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::infinity()), 0x7f80);
    EXPECT_EQ(bf16_from_float(-std::numeric_limits<float>::infinity()), 0xff80);
    EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_float(std::nanf("")))));
    EXPECT_TRUE(std::isnan(bf16_to_float(from_bits(0x7f800001u))));  // signalling NaN stays NaN
    EXPECT_EQ(bf16_from_float(0.0f), 0x0000);
    EXPECT_EQ(bf16_from_float(-0.0f), 0x8000);
}

TEST(Bf16, RoundTripIsExactForBf16Values) {
    for (uint32_t h = 0; h < 0x10000u; h += 7) {
        const bf16 b = static_cast<bf16>(h);
        if (std::isnan(bf16_to_float(b))) continue;
        EXPECT_EQ(bf16_from_float(bf16_to_float(b)), b);
    }
}

}  // namespace
}  // namespace bagualu
