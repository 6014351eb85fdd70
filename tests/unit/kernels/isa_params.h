// Test helpers for the kernel tables of kernels/dispatch.h: a fixture whose parameter is an ISA,
// which makes that ISA's table the active one for the test (so the ops.h entry points run it)
// and restores the previous one afterwards; on a CPU without the ISA the test is skipped with a
// message naming what the CPU lacks.
#pragma once
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "kernels/dispatch.h"

namespace bagualu::kernels {
// gtest prints a parameter by its name ("avx2") rather than its bytes.
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace bagualu::kernels

namespace bagualu::kernels::testing {

class IsaTest : public ::testing::TestWithParam<Isa> {
   protected:
    void SetUp() override {
        if (!isa_supported(GetParam())) GTEST_SKIP() << "needs " << isa_requirement(GetParam());
        set_active_isa(GetParam());
    }
    void TearDown() override { set_active_isa(saved_); }

   private:
    Isa saved_ = dispatch().isa;
};

inline std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) {
    return isa_name(info.param);
}

}  // namespace bagualu::kernels::testing

// Runs the TEST_Ps of `suite` (a subclass of IsaTest) once per ISA, named by the ISA.
#define BGL_INSTANTIATE_ISAS(suite)                                                        \
    INSTANTIATE_TEST_SUITE_P(                                                              \
        Isa, suite,                                                                        \
        ::testing::Values(::bagualu::kernels::Isa::generic, ::bagualu::kernels::Isa::avx2, \
                          ::bagualu::kernels::Isa::avx512),                                \
        ::bagualu::kernels::testing::isa_param_name)
