// The enumerated config keys: every spelling parses to its value, prints back to the same
// spelling (to_toml, which checkpoints and run directories keep) and survives the round trip;
// anything else is one InputError naming the file, key, value and what is expected.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/error.h"

namespace bagualu {
namespace {

template <typename E>
void expect_round_trip(const char* key, const std::vector<std::pair<const char*, E>>& values) {
    for (const auto& [text, value] : values) {
        EXPECT_EQ(parse_enum<E>(text, key), value) << key << " " << text;
        EXPECT_STREQ(name_of(value), text);
    }
}

TEST(ConfigEnums, EverySpellingParsesAndPrintsBack) {
    expect_round_trip<GateKind>("model.gate", {{"topk", GateKind::topk},
                                               {"switch", GateKind::switch_top1},
                                               {"gshard", GateKind::gshard},
                                               {"noisy", GateKind::noisy},
                                               {"swipe", GateKind::swipe}});
    expect_round_trip<Level>(
        "precision.ffn",
        {{"O0", Level::O0}, {"O1", Level::O1}, {"O2", Level::O2}, {"O3", Level::O3}});
    expect_round_trip<Dtype>(
        "precision.dtype",
        {{"fp32", Dtype::float32}, {"bf16", Dtype::bfloat16}, {"fp16", Dtype::float16}});
    expect_round_trip<Partition>(
        "optimizer.partition",
        {{"auto", Partition::automatic}, {"on", Partition::on}, {"off", Partition::off}});
    expect_round_trip<RouterPrecision>("precision.router", {{"fp32", RouterPrecision::fp32},
                                                            {"fp64", RouterPrecision::fp64},
                                                            {"half", RouterPrecision::half}});
    expect_round_trip<MomentDtype>("precision.moments",
                                   {{"fp32", MomentDtype::fp32}, {"bf16", MomentDtype::bfloat16}});
    expect_round_trip<Resume>("checkpoint.resume",
                              {{"never", Resume::never}, {"auto", Resume::automatic}});
    expect_round_trip<Recompute>(
        "train.recompute",
        {{"none", Recompute::none}, {"moe", Recompute::moe}, {"block", Recompute::block}});
    expect_round_trip<Collectives>("parallel.collectives", {{"auto", Collectives::automatic},
                                                            {"ring", Collectives::ring},
                                                            {"halving", Collectives::halving}});
}

TEST(ConfigEnums, ResolvedConfigRoundTripsThroughToml) {
    const TrainConfig a =
        default_config({"model.gate=noisy", "precision.dtype=fp16", "precision.embedding=O3",
                        "precision.head=O2", "optimizer.partition=off", "checkpoint.resume=auto",
                        "train.recompute=block", "precision.router=fp64"});
    EXPECT_EQ(a.precision.router, RouterPrecision::fp64);
    EXPECT_EQ(a.model.gate, GateKind::noisy);
    EXPECT_EQ(a.precision.dtype, Dtype::float16);
    EXPECT_EQ(a.precision.embedding, Level::O3);
    EXPECT_EQ(a.precision.attention, Level::O1);  // the default
    EXPECT_EQ(a.precision.head, Level::O2);
    EXPECT_EQ(a.optimizer.partition, Partition::off);
    EXPECT_EQ(a.checkpoint.resume, Resume::automatic);
    const std::string toml = to_toml(a);
    EXPECT_NE(toml.find("gate = 'noisy'"), std::string::npos) << toml;
    EXPECT_NE(toml.find("dtype = 'fp16'"), std::string::npos) << toml;
    const TrainConfig b = config_from_text(toml, "config.toml");
    EXPECT_EQ(to_toml(b), toml);
    EXPECT_EQ(b.model.gate, GateKind::noisy);
    EXPECT_EQ(b.precision.head, Level::O2);
    EXPECT_EQ(b.checkpoint.resume, Resume::automatic);
    EXPECT_EQ(b.train.recompute, Recompute::block);
    EXPECT_EQ(b.precision.router, RouterPrecision::fp64);
}

// SWIPE balances the step unless told otherwise; a checkpoint's config without the key was
// written before it existed, by a run that balanced each round, and reads as such (so a resume
// with today's default is refused naming the key rather than changing the rule mid-run).
TEST(ConfigEnums, SwipeBalanceDefaultsToStepAndOldCheckpointsReadAsRound) {
    EXPECT_EQ(default_config().model.swipe_balance, SwipeBalance::step);
    EXPECT_EQ(default_config({"model.swipe_balance=round"}).model.swipe_balance,
              SwipeBalance::round);
    std::string toml = to_toml(default_config({"model.gate=swipe"}));
    EXPECT_EQ(config_from_text(toml, "manifest").model.swipe_balance, SwipeBalance::step);
    const size_t at = toml.find("swipe_balance = 'step'\n");
    ASSERT_NE(at, std::string::npos) << toml;
    toml.erase(at, std::string("swipe_balance = 'step'\n").size());
    const TrainConfig old = config_from_text(toml, "manifest");
    EXPECT_EQ(old.model.swipe_balance, SwipeBalance::round);
    ASSERT_EQ(differing_keys(default_config({"model.gate=swipe"}), old, "model").size(), 1u);
    EXPECT_EQ(differing_keys(default_config({"model.gate=swipe"}), old, "model")[0].key,
              "model.swipe_balance");
}

TEST(ConfigEnums, AnythingElseIsOneErrorNamingKeyValueAndChoices) {
    auto message = [](const std::vector<std::string>& sets) -> std::string {
        try {
            default_config(sets);
        } catch (const InputError& e) {
            return e.what();
        }
        return "(no error)";
    };
    EXPECT_EQ(message({"precision.attention=O4"}),
              "--set precision.attention=O4: precision.attention = \"O4\": expected \"O0\", "
              "\"O1\", \"O2\" or \"O3\"");
    EXPECT_EQ(message({"model.gate=Switch"}),
              "--set model.gate=Switch: model.gate = \"Switch\": expected topk, switch, gshard, "
              "noisy or swipe");
    EXPECT_EQ(message({"precision.dtype=3"}),
              "--set precision.dtype=3: precision.dtype: expected a string, got 3");
    EXPECT_EQ(message({"parallel.collectives=tree"}),
              "--set parallel.collectives=tree: parallel.collectives = \"tree\": expected "
              "\"auto\", \"ring\" or "
              "\"halving\"");
    EXPECT_EQ(message({"train.recompute=full"}),
              "--set train.recompute=full: train.recompute = \"full\": expected \"none\", \"moe\" "
              "or \"block\"");
    // a value that parses but does not fit the model
    EXPECT_EQ(message({"train.recompute=moe", "model.moe_every=0"}),
              "--set train.recompute=moe --set model.moe_every=0: train.recompute = \"moe\" needs "
              "MoE blocks (model.moe_every > 0)");
    EXPECT_EQ(message({"train.recompute=block", "model.moe_every=0"}), "(no error)");
    EXPECT_EQ(message({"precision.moments=fp16"}),
              "--set precision.moments=fp16: precision.moments = \"fp16\": expected \"fp32\" or "
              "\"bf16\"");
    // a bf16 moment cannot decay by less than its rounding step
    EXPECT_EQ(message({"precision.dtype=bf16", "precision.moments=bf16", "train.beta1=0.999"}),
              "--set precision.moments=bf16 --set train.beta1=0.999: "
              "train.beta1 = 0.999: must be at most 0.99609375 (1 - 2^-8) with precision.moments "
              "= \"bf16\" in a half-precision run (a bf16 moment cannot decay by less than its "
              "rounding step)");
    EXPECT_EQ(message({"precision.dtype=fp16", "precision.moments=bf16", "train.beta2=0.999"}),
              "--set precision.moments=bf16 --set train.beta2=0.999: "
              "train.beta2 = 0.999: must be at most 0.99609375 (1 - 2^-8) with precision.moments "
              "= \"bf16\" in a half-precision run (a bf16 moment cannot decay by less than its "
              "rounding step)");
    EXPECT_EQ(message({"precision.dtype=bf16", "precision.moments=bf16", "train.beta2=0.99609375"}),
              "(no error)");
    // float32 runs keep float32 moments whatever the key says
    EXPECT_EQ(message({"precision.moments=bf16", "train.beta2=0.999"}), "(no error)");
}

}  // namespace
}  // namespace bagualu
