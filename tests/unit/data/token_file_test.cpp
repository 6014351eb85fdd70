// Token shard round trips (uint16 and uint32), the exact byte layout, and every malformed-file
// error: each must be an InputError naming the path and the fact that is wrong.
#include "data/token_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "test_util.h"

namespace bagualu::data {
namespace {

using testing::expect_input_error;
using testing::TempDir;

std::string header_bytes(int32_t magic, int32_t version, int32_t count) {
    int32_t h[kTokenFileHeaderInts] = {};
    h[0]                            = magic;
    h[1]                            = version;
    h[2]                            = count;
    return {reinterpret_cast<const char*>(h), sizeof(h)};
}

template <typename T>
std::string body_bytes(std::initializer_list<T> tokens) {
    std::string out;
    for (T t : tokens) out.append(reinterpret_cast<const char*>(&t), sizeof(T));
    return out;
}

TEST(TokenFile, RoundTripVersion1) {
    TempDir dir;
    const std::string path            = dir.path("a.bin");
    const std::vector<int32_t> tokens = {0, 1, 2, 65535, 300, 7};
    write_token_file(path, tokens, 65536);
    EXPECT_EQ(std::filesystem::file_size(path), kTokenFileHeaderBytes + 2 * tokens.size());
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    const TokenFile f = read_token_file(path, 65536);
    EXPECT_EQ(f.version, 1);
    EXPECT_EQ(f.tokens, tokens);
}

TEST(TokenFile, RoundTripVersion2) {
    TempDir dir;
    const std::string path            = dir.path("b.bin");
    const std::vector<int32_t> tokens = {0, 65536, 100000, 199999, 5};
    write_token_file(path, tokens, 200000);
    EXPECT_EQ(std::filesystem::file_size(path), kTokenFileHeaderBytes + 4 * tokens.size());
    const TokenFile f = read_token_file(path, 200000);
    EXPECT_EQ(f.version, 2);
    EXPECT_EQ(f.tokens, tokens);
}

TEST(TokenFile, HeaderLayout) {
    TempDir dir;
    const std::string path = dir.path("c.bin");
    write_token_file(path, std::vector<int32_t>{3, 4, 5}, 8192);
    const std::string bytes = testing::read_all(path);
    EXPECT_EQ(bytes.substr(0, kTokenFileHeaderBytes), header_bytes(kTokenFileMagic, 1, 3));
    EXPECT_EQ(bytes.substr(kTokenFileHeaderBytes), body_bytes<uint16_t>({3, 4, 5}));
}

TEST(TokenFile, EmptyShard) {
    TempDir dir;
    const std::string path = dir.path("empty.bin");
    write_token_file(path, std::vector<int32_t>{}, 100);
    EXPECT_TRUE(read_token_file(path, 100).tokens.empty());
}

TEST(TokenFile, OverwritesExisting) {
    TempDir dir;
    const std::string path = dir.path("o.bin");
    write_token_file(path, std::vector<int32_t>{1, 2, 3, 4}, 10);
    write_token_file(path, std::vector<int32_t>{9}, 10);
    EXPECT_EQ(read_token_file(path, 10).tokens, std::vector<int32_t>{9});
}

TEST(TokenFile, WriteIntoMissingFolderNamesPath) {
    TempDir dir;
    const std::string path = dir.path("no/such/dir/x.bin");
    expect_input_error([&] { write_token_file(path, std::vector<int32_t>{1}, 10); }, {path});
}

TEST(TokenFile, MissingFile) {
    TempDir dir;
    const std::string path = dir.path("missing.bin");
    expect_input_error([&] { read_token_file(path, 10); }, {path, "no such file"});
}

TEST(TokenFile, ShortHeader) {
    TempDir dir;
    const std::string path =
        dir.write("short.bin", header_bytes(kTokenFileMagic, 1, 0).substr(0, 100));
    expect_input_error([&] { read_token_file(path, 10); }, {path, "100 bytes", "header"});
}

TEST(TokenFile, BadMagic) {
    TempDir dir;
    const std::string path = dir.write("magic.bin", header_bytes(12345, 1, 0));
    expect_input_error([&] { read_token_file(path, 10); },
                       {path, "bad magic 12345", "20240520", "not a token shard"});
}

TEST(TokenFile, BadVersion) {
    TempDir dir;
    const std::string path = dir.write("version.bin", header_bytes(kTokenFileMagic, 3, 0));
    expect_input_error([&] { read_token_file(path, 10); }, {path, "version 3"});
}

TEST(TokenFile, TruncatedBody) {
    TempDir dir;
    const std::string path =
        dir.write("trunc.bin", header_bytes(kTokenFileMagic, 1, 5) + body_bytes<uint16_t>({1, 2}));
    expect_input_error(
        [&] { read_token_file(path, 10); },
        {path, "truncated: header says 5 tokens (1034 bytes) but file has 1028 bytes"});
}

TEST(TokenFile, TrailingData) {
    TempDir dir;
    const std::string path =
        dir.write("long.bin", header_bytes(kTokenFileMagic, 2, 1) + body_bytes<uint32_t>({1, 2}));
    expect_input_error([&] { read_token_file(path, 10); }, {path, "header says 1 tokens", "1032"});
}

TEST(TokenFile, TokenOutsideVocab) {
    TempDir dir;
    const std::string path = dir.write(
        "vocab.bin", header_bytes(kTokenFileMagic, 1, 4) + body_bytes<uint16_t>({1, 2, 9000, 3}));
    expect_input_error([&] { read_token_file(path, 8192); },
                       {path, "token 9000 at position 2 is >= vocab_size 8192"});
}

TEST(TokenFile, HugeUint32TokenIsNotNegative) {
    TempDir dir;
    const std::string path = dir.write(
        "huge.bin", header_bytes(kTokenFileMagic, 2, 1) + body_bytes<uint32_t>({4000000000u}));
    expect_input_error([&] { read_token_file(path, 100000); },
                       {path, "token 4000000000 at position 0"});
}

}  // namespace
}  // namespace bagualu::data
