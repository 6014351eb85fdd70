// Tests for the safetensors reader and writer: round trips over every dtype, files built byte by
// byte from the spec, the writer's output checked by a separate JSON parse, one test per header
// defect the reader must reject, and random mutations of a valid file that must either load
// consistently or throw InputError.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"

namespace bagualu::io {
namespace {

namespace fs = std::filesystem;
using Bytes  = std::vector<std::byte>;

class SafetensorsTest : public ::testing::Test {
   protected:
    void SetUp() override {
        const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_             = fs::temp_directory_path() /
               fmt::format("bgl_safetensors_{}_{}", ::getpid(), test->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

    fs::path dir_;
};

Bytes to_bytes(std::string_view s) {
    Bytes b(s.size());
    if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
    return b;
}

// A file in the spec's layout: u64 LE header length, header text as given, then `data`.
Bytes make_file(std::string_view header, const Bytes& data = {}) {
    Bytes out(8);
    const uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    const Bytes h = to_bytes(header);
    out.insert(out.end(), h.begin(), h.end());
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

void write_bytes(const std::string& path, const Bytes& b) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Bytes read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return to_bytes(s);
}

template <typename T>
Bytes raw(const std::vector<T>& v) {
    Bytes b(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// ---- round trips ----

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndShape) {
    const std::vector<float> f32         = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
    const std::vector<uint16_t> bf16     = {0x3f80, 0xc040, 0x0000, 0x7f80};  // 1 -3 0 inf
    const std::vector<uint16_t> f16      = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00};
    const std::vector<double> f64        = {0.1};
    const std::vector<int32_t> i32       = {};
    const std::vector<int64_t> i64       = {-1, 1LL << 40};
    const std::vector<uint8_t> u8        = {1, 2, 3, 4, 5, 6, 7};
    const std::vector<TensorRef> tensors = {
        {"w.f32", DType::F32, {2, 3}, f32.data()},
        {"u8.odd", DType::U8, {7}, u8.data()},  // leaves the next tensor unaligned
        {"w.bf16", DType::BF16, {2, 2}, bf16.data()},
        {"w.f16", DType::F16, {5}, f16.data()},
        {"scalar", DType::F64, {}, f64.data()},
        {"empty", DType::I32, {0, 5}, nullptr},
        {"i64", DType::I64, {2, 1}, i64.data()},
    };
    const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}};
    write_safetensors(path("a.safetensors"), tensors, meta);

    const SafetensorsFile f(path("a.safetensors"));
    EXPECT_EQ(f.path(), path("a.safetensors"));
    EXPECT_EQ(f.metadata(), meta);
    std::vector<std::string> want_names;
    for (const auto& t : tensors) want_names.push_back(t.name);
    EXPECT_EQ(f.names(), want_names);
    for (const auto& t : tensors) {
        ASSERT_TRUE(f.contains(t.name));
        const TensorInfo& info = f.info(t.name);
        EXPECT_EQ(info.dtype, t.dtype) << t.name;
        EXPECT_EQ(info.shape, t.shape) << t.name;
        EXPECT_EQ(info.end - info.begin, static_cast<uint64_t>(info.numel) * dtype_size(t.dtype));
    }
    EXPECT_FALSE(f.contains("missing"));
    EXPECT_EQ(f.info("scalar").numel, 1);
    EXPECT_EQ(f.info("empty").numel, 0);
    EXPECT_TRUE(f.bytes("empty").empty());

    const auto same = [](std::span<const std::byte> a, const Bytes& b) {
        return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
    };
    EXPECT_TRUE(same(f.bytes("w.f32"), raw(f32)));
    EXPECT_TRUE(same(f.bytes("u8.odd"), raw(u8)));
    EXPECT_TRUE(same(f.bytes("w.bf16"), raw(bf16)));
    EXPECT_TRUE(same(f.bytes("i64"), raw(i64)));

    EXPECT_EQ(f.read_f32("w.f32"), f32);
    EXPECT_EQ(f.read_f32("w.bf16"),
              (std::vector<float>{1.0f, -3.0f, 0.0f, std::numeric_limits<float>::infinity()}));
    EXPECT_EQ(f.read_f32("w.f16"), (std::vector<float>{1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24),
                                                       std::numeric_limits<float>::infinity()}));
    EXPECT_EQ(f.read_f32("scalar"), std::vector<float>{0.1f});
}

TEST_F(SafetensorsTest, F16NanAndNegativeZeroConvert) {
    const std::vector<uint16_t> f16 = {0x7e00, 0x8000, 0x83ff};
    const TensorRef t{"h", DType::F16, {3}, f16.data()};
    write_safetensors(path("h.safetensors"), std::span(&t, 1));
    const auto v = SafetensorsFile(path("h.safetensors")).read_f32("h");
    EXPECT_TRUE(std::isnan(v[0]));
    EXPECT_TRUE(v[1] == 0.0f && std::signbit(v[1]));
    EXPECT_EQ(v[2], -std::ldexp(1023.0f, -24));  // largest negative subnormal
}

TEST_F(SafetensorsTest, EmptyFileListRoundTrips) {
    write_safetensors(path("e.safetensors"), {}, {});
    const SafetensorsFile f(path("e.safetensors"));
    EXPECT_TRUE(f.names().empty());
    EXPECT_TRUE(f.metadata().empty());
}

TEST_F(SafetensorsTest, WriterBytesFollowTheSpec) {
    const std::vector<float> a           = {1, 2, 3};
    const std::vector<uint16_t> b        = {7};
    const std::vector<TensorRef> tensors = {{"a", DType::F32, {3}, a.data()},
                                            {"b", DType::BF16, {1, 1}, b.data()}};
    write_safetensors(path("w.safetensors"), tensors, {{"k", "v"}});
    const Bytes file = read_bytes(path("w.safetensors"));

    // Independent reading: header length, JSON, and raw offsets only.
    uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    ASSERT_EQ(file.size(), 8 + n + 14);
    const std::string header(reinterpret_cast<const char*>(file.data()) + 8, n);
    EXPECT_EQ(header.front(), '{');
    EXPECT_EQ(header.find_first_not_of(' ', header.rfind('}') + 1), std::string::npos);
    const auto j = nlohmann::json::parse(header);
    EXPECT_EQ(j["__metadata__"], (nlohmann::json{{"k", "v"}}));
    EXPECT_EQ(j["a"]["dtype"], "F32");
    EXPECT_EQ(j["a"]["shape"], (nlohmann::json{3}));
    EXPECT_EQ(j["a"]["data_offsets"], (nlohmann::json{0, 12}));
    EXPECT_EQ(j["b"]["dtype"], "BF16");
    EXPECT_EQ(j["b"]["shape"], (nlohmann::json{1, 1}));
    EXPECT_EQ(j["b"]["data_offsets"], (nlohmann::json{12, 14}));
    float a1 = 0;
    std::memcpy(&a1, file.data() + 8 + n + 4, 4);
    EXPECT_EQ(a1, 2.0f);
}

TEST_F(SafetensorsTest, ReadsHandBuiltSpecFile) {
    // Unpadded header, keys not in buffer order, extra whitespace, data in little-endian.
    const std::string header = R"({ "b" : {"dtype":"I32","shape":[1],"data_offsets":[8,12]},)"
                               R"( "__metadata__": {"who": "spec"},)"
                               R"( "a": {"data_offsets":[0,8],"shape":[2],"dtype":"F32"} })";
    const Bytes data         = {std::byte{0x00}, std::byte{0x00}, std::byte{0x80}, std::byte{0x3f},
                                std::byte{0x00}, std::byte{0x00}, std::byte{0x00}, std::byte{0xc0},
                                std::byte{0x2a}, std::byte{0x00}, std::byte{0x00}, std::byte{0x00}};
    const Bytes file         = make_file(header, data);
    write_bytes(path("spec.safetensors"), file);
    for (const auto& f :
         {SafetensorsFile(path("spec.safetensors")), SafetensorsFile::from_memory(file, "mem")}) {
        EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
        EXPECT_EQ(f.read_f32("a"), (std::vector<float>{1.0f, -2.0f}));
        int32_t b = 0;
        std::memcpy(&b, f.bytes("b").data(), 4);
        EXPECT_EQ(b, 42);
        EXPECT_EQ(f.metadata().at("who"), "spec");
    }
}

TEST_F(SafetensorsTest, ZeroSizeTensorsKeepHeaderOrderAtTheSameOffset) {
    const std::string header = R"({"z2":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                               R"("x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                               R"("z1":{"dtype":"F32","shape":[3,0],"data_offsets":[4,4]}})";
    const auto f             = SafetensorsFile::from_memory(make_file(header, Bytes(4)), "z");
    EXPECT_EQ(f.names(), (std::vector<std::string>{"x", "z2", "z1"}));
}

TEST_F(SafetensorsTest, WriterReplacesAtomicallyAndLeavesNoTempFiles) {
    const std::vector<float> a = {1}, b = {2, 3};
    const TensorRef ta{"t", DType::F32, {1}, a.data()}, tb{"t", DType::F32, {2}, b.data()};
    write_safetensors(path("r.safetensors"), std::span(&ta, 1));
    write_safetensors(path("r.safetensors"), std::span(&tb, 1));
    EXPECT_EQ(SafetensorsFile(path("r.safetensors")).read_f32("t"), b);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);

    // A target that cannot be replaced: the error names it and no temp file is left.
    fs::create_directory(path("adir"));
    try {
        write_safetensors(path("adir"), std::span(&ta, 1));
        FAIL() << "expected InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(path("adir")), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
    EXPECT_THROW(write_safetensors(path("no/such/dir/x.safetensors"), std::span(&ta, 1)),
                 InputError);
}

// ---- errors ----

void expect_input_error(const std::function<void()>& fn, const std::string& must_contain,
                        const std::string& hint) {
    try {
        fn();
        ADD_FAILURE() << "no InputError; expected one mentioning " << hint;
    } catch (const InputError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(must_contain), std::string::npos) << msg;
        EXPECT_NE(msg.find(hint), std::string::npos) << "wanted \"" << hint << "\" in: " << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
}

std::string entry(std::string_view name, std::string_view dtype, std::string_view shape,
                  uint64_t begin, uint64_t end) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype,
                       shape, begin, end);
}

TEST_F(SafetensorsTest, RejectsEveryHeaderDefectNamingTheFile) {
    const std::string a8 = entry("a", "F32", "[2]", 0, 8);
    Bytes huge_len(16);
    const uint64_t huge = 200'000'000;
    std::memcpy(huge_len.data(), &huge, 8);
    Bytes past_end = make_file("{}");
    past_end[0]    = std::byte{50};

    struct Case {
        std::string hint;
        Bytes file;
    };
    const std::vector<Case> cases = {
        {"too short", to_bytes("abc")},
        {"runs past the end", past_end},
        {"byte limit", huge_len},
        {"not valid JSON", make_file(R"({"a": {"dtype": )")},
        {"not valid JSON", make_file("{} trailing")},
        {"does not start with", make_file("[1, 2]")},
        {"does not start with", make_file("")},
        {"unsupported dtype \"Q4\"",
         make_file("{" + entry("a", "Q4", "[2]", 0, 8) + "}", Bytes(8))},
        {"unsupported dtype", make_file(R"({"a":{"dtype":3,"shape":[],"data_offsets":[0,0]}})")},
        {"negative dim -2", make_file("{" + entry("a", "F32", "[-2]", 0, 8) + "}", Bytes(8))},
        {"non-negative integers",
         make_file("{" + entry("a", "F32", "[2.0]", 0, 8) + "}", Bytes(8))},
        {"begin 8 > end 0", make_file("{" + entry("a", "U8", "[0]", 8, 0) + "}", Bytes(8))},
        {"truncated", make_file("{" + a8 + "}", Bytes(6))},
        {"overlap tensor \"a\"",
         make_file("{" + a8 + "," + entry("b", "F32", "[2]", 4, 12) + "}", Bytes(12))},
        {"bytes [8, 12) of the data buffer belong to no tensor",
         make_file("{" + a8 + "," + entry("b", "F32", "[1]", 12, 16) + "}", Bytes(16))},
        {"bytes [0, 4) of the data buffer",
         make_file("{" + entry("a", "F32", "[1]", 4, 8) + "}", Bytes(8))},
        {"4 trailing bytes", make_file("{" + a8 + "}", Bytes(12))},
        {"needs 12 bytes", make_file("{" + entry("a", "F32", "[3]", 0, 8) + "}", Bytes(8))},
        {"needs 8 bytes", make_file("{" + entry("a", "F64", "[]", 0, 4) + "}", Bytes(4))},
        {"duplicate key \"a\"", make_file("{" + a8 + "," + a8 + "}", Bytes(8))},
        {"duplicate key \"dtype\"",
         make_file(R"({"a":{"dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0]}})")},
        {"not a string", make_file(R"({"__metadata__":{"k":1}})")},
        {"__metadata__ is not an object", make_file(R"({"__metadata__":[]})")},
        {"needs dtype, shape and data_offsets", make_file(R"({"a":{"dtype":"U8","shape":[0]}})")},
        {"unexpected field \"extra\"",
         make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"extra":1}})")},
        {"entry is not an object", make_file(R"({"a":[1]})")},
        {"must be [begin, end]",
         make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0]}})")},
        {"non-negative integers, got 0.0",
         make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0.0,0]}})")},
        {"shape is not an array",
         make_file(R"({"a":{"dtype":"U8","shape":3,"data_offsets":[0,0]}})")},
        {"nested too deeply",
         make_file(R"({"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", Bytes(1))},
        {"shape is too large",
         make_file("{" + entry("a", "F32", "[4294967296,4294967296,16]", 0, 0) + "}")},
        {"shape is too large",
         make_file("{" + entry("a", "F64", "[4611686018427387904]", 0, 0) + "}")},
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
        SCOPED_TRACE(cases[i].hint);
        const std::string p = path(fmt::format("bad_{}.safetensors", i));
        write_bytes(p, cases[i].file);
        expect_input_error([&] { SafetensorsFile f(p); }, p, cases[i].hint);
        expect_input_error([&] { SafetensorsFile::from_memory(cases[i].file, "mem.st"); }, "mem.st",
                           cases[i].hint);
    }
}

TEST_F(SafetensorsTest, MissingFilesAndTensorsNameThePathAndTensor) {
    expect_input_error([&] { SafetensorsFile f(path("nope.safetensors")); },
                       path("nope.safetensors"), "cannot open");
    expect_input_error([&] { SafetensorsFile f(dir_.string()); }, dir_.string(),
                       "not a regular file");
    write_bytes(path("empty.safetensors"), {});
    expect_input_error([&] { SafetensorsFile f(path("empty.safetensors")); },
                       path("empty.safetensors"), "too short");

    const std::vector<int32_t> v = {1, 2};
    const TensorRef t{"ints", DType::I32, {2}, v.data()};
    write_safetensors(path("i.safetensors"), std::span(&t, 1));
    const SafetensorsFile f(path("i.safetensors"));
    expect_input_error([&] { f.info("ghost"); }, path("i.safetensors"), "\"ghost\"");
    expect_input_error([&] { f.bytes("ghost"); }, path("i.safetensors"), "\"ghost\"");
    expect_input_error([&] { f.read_f32("ghost"); }, path("i.safetensors"), "\"ghost\"");
    expect_input_error([&] { f.read_f32("ints"); }, path("i.safetensors"), "dtype I32");
}

// ---- mutations ----

// Every tensor of a loaded file must lie inside the input and the tensors must tile the buffer.
void check_consistent(const SafetensorsFile& f, const Bytes& input) {
    uint64_t total = 0;
    for (const std::string& name : f.names()) {
        const TensorInfo& info             = f.info(name);
        const std::span<const std::byte> b = f.bytes(name);
        ASSERT_EQ(b.size(), info.end - info.begin);
        ASSERT_EQ(b.size(), static_cast<uint64_t>(info.numel) * dtype_size(info.dtype));
        total += b.size();
        if (info.dtype == DType::F32 || info.dtype == DType::BF16 || info.dtype == DType::F16 ||
            info.dtype == DType::F64) {
            ASSERT_EQ(f.read_f32(name).size(), static_cast<std::size_t>(info.numel));
        }
    }
    ASSERT_LE(total, input.size());
}

TEST_F(SafetensorsTest, RandomMutationsLoadConsistentlyOrThrowInputError) {
    const std::vector<float> a(6, 1.0f);
    const std::vector<uint16_t> b(5, 0x3c00);
    const std::vector<uint8_t> c(3, 9);
    const std::vector<TensorRef> tensors = {{"alpha", DType::F32, {2, 3}, a.data()},
                                            {"beta", DType::F16, {5}, b.data()},
                                            {"gamma", DType::U8, {3}, c.data()},
                                            {"delta", DType::F64, {0}, nullptr}};
    write_safetensors(path("v.safetensors"), tensors, {{"m", "1"}});
    const Bytes valid   = read_bytes(path("v.safetensors"));
    uint64_t header_len = 0;
    std::memcpy(&header_len, valid.data(), 8);

    std::mt19937_64 rng(1234);
    const auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    const std::string_view json_chars = "{}[]\":,0123456789-.e \\ux";
    int loaded = 0, rejected = 0;
    for (int iter = 0; iter < 600; ++iter) {
        Bytes m = valid;
        switch (iter % 5) {
            case 0:  // truncate anywhere
                m.resize(pick(m.size()));
                break;
            case 1:  // flip bits anywhere
                for (int k = 0; k < 1 + iter % 4; ++k) m[pick(m.size())] ^= std::byte(1 << pick(8));
                break;
            case 2:  // JSON-significant characters inside the header
                for (int k = 0; k < 1 + iter % 3; ++k) {
                    m[8 + pick(header_len)] = std::byte(json_chars[pick(json_chars.size())]);
                }
                break;
            case 3: {  // a digit of an offset or dim changed: structurally plausible headers
                std::vector<std::size_t> digits;
                for (std::size_t i = 8; i < 8 + header_len; ++i) {
                    if (std::isdigit(static_cast<int>(m[i]))) digits.push_back(i);
                }
                m[digits[pick(digits.size())]] = std::byte('0' + pick(10));
                break;
            }
            case 4: {  // header length field off by a little, or data grown/shrunk
                uint64_t n = header_len + pick(17) - 8;
                if (iter % 2)
                    std::memcpy(m.data(), &n, 8);
                else
                    m.resize(m.size() + pick(9) - 4);
                break;
            }
        }
        try {
            const auto f = SafetensorsFile::from_memory(m, "mutant");
            check_consistent(f, m);
            ++loaded;
        } catch (const InputError& e) {
            ASSERT_NE(std::string(e.what()).find("mutant"), std::string::npos) << e.what();
            ++rejected;
        }
    }
    // Both outcomes must occur, or the mutations are not exercising the parser.
    EXPECT_GT(loaded, 20);
    EXPECT_GT(rejected, 200);
}

}  // namespace
}  // namespace bagualu::io
