// Tests for reading an exported model's config.json (model/model_io.h): what
// model_config_to_json writes reads back unchanged, and fields of the wrong JSON type or beyond
// 32 bits are InputErrors naming the file and the key (cases found by fuzz/model_config_fuzz).
#include "model/model_io.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace bagualu::model {
namespace {

ModelConfig tiny() {
    ModelConfig m;
    m.vocab_size = 512;
    m.d_model    = 64;
    m.n_layer    = 2;
    m.n_head     = 4;
    m.seq_len    = 64;
    m.d_ff       = 128;
    m.n_experts  = 4;
    m.top_k      = 2;
    m.moe_every  = 2;
    return m;
}

// The InputError's message, or "" when j loads.
std::string error_of(const nlohmann::json& j) {
    try {
        (void)model_config_from_json(j, "m/config.json");
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

TEST(ModelConfigJson, RoundTrips) {
    const nlohmann::json j = model_config_to_json(tiny());
    EXPECT_EQ(model_config_to_json(model_config_from_json(j, "m/config.json")), j);
}

// Experts of their own width survive the round trip; a config.json from before the key (none)
// loads with experts of width d_ff.
TEST(ModelConfigJson, ExpertWidthRoundTripsAndDefaultsToDff) {
    ModelConfig m    = tiny();
    m.expert_d_ff    = 48;
    nlohmann::json j = model_config_to_json(m);
    EXPECT_EQ(model_config_from_json(j, "m/config.json").expert_width(), 48);
    j.erase("expert_d_ff");
    const ModelConfig old = model_config_from_json(j, "m/config.json");
    EXPECT_EQ(old.expert_d_ff, 0);
    EXPECT_EQ(old.expert_width(), m.d_ff);
}

TEST(ModelConfigJson, ModelTypeOfAnotherJsonTypeIsAnInputError) {
    for (const nlohmann::json& v :
         {nlohmann::json(512), nlohmann::json::array(), nlohmann::json()}) {
        nlohmann::json j    = model_config_to_json(tiny());
        j["model_type"]     = v;
        const std::string e = error_of(j);
        EXPECT_NE(e.find("m/config.json: model_type"), std::string::npos) << v.dump() << ": " << e;
    }
    nlohmann::json j = model_config_to_json(tiny());
    j.erase("model_type");
    EXPECT_NE(error_of(j).find("model_type"), std::string::npos);
}

TEST(ModelConfigJson, IntegersBeyond32BitsAreInputErrorsNotWrapped) {
    // 2^32 + 64 used to wrap to 64, a valid d_model
    for (const nlohmann::json& v : {nlohmann::json(4294967360LL), nlohmann::json(-4294967232LL),
                                    nlohmann::json(18446744073709551615ULL)}) {
        nlohmann::json j    = model_config_to_json(tiny());
        j["d_model"]        = v;
        const std::string e = error_of(j);
        EXPECT_NE(e.find("m/config.json: d_model = " + v.dump() + " is out of range"),
                  std::string::npos)
            << e;
    }
}

}  // namespace
}  // namespace bagualu::model
