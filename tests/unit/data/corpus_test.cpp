// Corpus files and folders: the folder rules, JSON Lines and JSON arrays with their errors
// (file and line named), gzip (members, truncation, trailing bytes), and the file listing that
// meta.json records.
#include "data/corpus.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace bagualu::data {
namespace {

using testing::expect_input_error;
using testing::TempDir;

using Entries = std::vector<std::string>;

// `text` as one gzip member (what gzip(1) writes).
std::string gzip(std::string_view text) {
    z_stream zs{};
    EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&zs, text.size()) + 32, '\0');
    zs.next_in   = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
    zs.avail_in  = static_cast<uInt>(text.size());
    zs.next_out  = reinterpret_cast<Bytef*>(out.data());
    zs.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    return out;
}

TEST(Corpus, FolderRules) {
    TempDir dir;
    dir.write("corpus/b_file", "bee one\n%\nbee two\n");
    dir.write("corpus/a_file", "\x1b[32mayy\x1b[m\n%\n");
    dir.write("corpus/a_file.dat", std::string("\0\0\0\2binary", 10));
    dir.write("corpus/a_file.u8", "should be skipped\n");
    dir.write("corpus/latin1", "caf\xe9\n");
    dir.write("corpus/sub/nested", "not read: folders are not recursive\n");
    std::filesystem::create_symlink(dir.path("corpus/b_file"), dir.path("corpus/c_link"));
    EXPECT_EQ(read_corpus_entries({dir.path("corpus")}), (Entries{"ayy", "bee one", "bee two"}));
}

TEST(Corpus, FilesAndFoldersConcatenateInOrder) {
    TempDir dir;
    const std::string one = dir.write("one", "1a\n%\n1b\n");
    dir.write("two/x", "2\n");
    dir.write("two/y.jsonl", "{\"text\": \"3\"}\n");
    dir.write("two/z.txt.gz", gzip("4\n\n5\n"));
    EXPECT_EQ(read_corpus_entries({dir.path("two"), one}),
              (Entries{"2", "3", "4", "5", "1a", "1b"}));
}

TEST(Corpus, MissingPathNamesIt) {
    TempDir dir;
    const std::string path = dir.path("nowhere");
    expect_input_error([&] { read_corpus_entries({path}); }, {path, "no such file"});
}

TEST(Corpus, NamedBinaryFileIsAnError) {
    TempDir dir;
    const std::string path = dir.write("bin.dat", std::string("\0\1\2", 3));
    expect_input_error([&] { read_corpus_entries({path}); }, {path, "UTF-8"});
}

TEST(Corpus, JsonLinesKeepTheTextAsItIs) {
    TempDir dir;
    const std::string path =
        dir.write("docs.jsonl",
                  "{\"id\": 1, \"text\": \"  first\\nline \\u00e9\\t\"}\r\n\n   \n"
                  "{\"text\": \"second \xe6\xb1\x89\", \"meta\": {\"text\": \"not this\"}}\n"
                  "{\"text\": \"   \"}\n{\"text\": \"\"}\n{\"text\": \"% not a separator\"}");
    EXPECT_EQ(read_corpus_entries({path}),
              (Entries{"  first\nline \xc3\xa9\t", "second \xe6\xb1\x89", "% not a separator"}));
}

TEST(Corpus, TextKeyPicksTheField) {
    TempDir dir;
    const std::string path =
        dir.write("docs.ndjson", "{\"content\": \"a\", \"text\": \"b\"}\n{\"content\": \"c\"}\n");
    EXPECT_EQ(read_corpus_entries({path}, "content"), (Entries{"a", "c"}));
    expect_input_error([&] { read_corpus_entries({path}); },
                       {path + ":2", "no field \"text\"", "data.text_key", "content"});
}

TEST(Corpus, JsonArrayOfObjects) {
    TempDir dir;
    const std::string path =
        dir.write("docs.json", "\xef\xbb\xbf\n [ {\"text\": \"a\"},\n  {\"text\": \"b\\n\"} ]\n");
    EXPECT_EQ(read_corpus_entries({path}), (Entries{"a", "b\n"}));
    const std::string bad = dir.write("bad.json", "[{\"text\": \"a\"}, {\"text\": 3}]");
    expect_input_error([&] { read_corpus_entries({bad}); },
                       {bad + ": element 2", "\"text\" is a JSON number", "expected a string"});
}

TEST(Corpus, JsonErrorsNameTheFileAndLine) {
    TempDir dir;
    const std::string a = dir.write("a.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"cut\n");
    expect_input_error([&] { read_corpus_entries({a}); }, {a + ":2", "not valid JSON"});
    const std::string b = dir.write("b.jsonl", "\n\n[\"text\"]\n");
    expect_input_error([&] { read_corpus_entries({b}); },
                       {b + ": element 1", "a JSON string", "expected an object"});
    const std::string c = dir.write("c.jsonl", "{\"text\": \"ok\"}\n\"text\"\n");
    expect_input_error([&] { read_corpus_entries({c}); }, {c + ":2", "a JSON string"});
    const std::string d = dir.write("d.jsonl", "{\"text\": null}\n");
    expect_input_error([&] { read_corpus_entries({d}); }, {d + ":1", "a JSON null"});
    const std::string e = dir.write("e.jsonl", "{\"text\": \"caf\xe9\"}\n");
    expect_input_error([&] { read_corpus_entries({e}); }, {e + ":1", "not valid JSON"});
    const std::string f = dir.write("f.jsonl", "{\"text\": \"a\\u0000b\"}\n");
    expect_input_error([&] { read_corpus_entries({f}); }, {f + ":1", "NUL"});
    const std::string g = dir.write("g.jsonl", "{}\n");
    expect_input_error([&] { read_corpus_entries({g}); }, {g + ":1", "has no fields"});
    // a folder's JSON files are read as JSON too: their errors are not skipped
    dir.write("folder/x.jsonl", "not json\n");
    expect_input_error([&] { read_corpus_entries({dir.path("folder")}); },
                       {dir.path("folder/x.jsonl") + ":1", "not valid JSON"});
}

TEST(Corpus, GzipFilesAreInflated) {
    TempDir dir;
    const std::string jsonl = "{\"text\": \"one\"}\n{\"text\": \"two\"}\n";
    const std::string a     = dir.write("a.jsonl.gz", gzip(jsonl));
    EXPECT_EQ(read_corpus_entries({a}), (Entries{"one", "two"}));
    // members concatenated (cat a.gz b.gz) read as one file
    const std::string b = dir.write("b.gz", gzip("x\n%\ny\n") + gzip("z\n"));
    EXPECT_EQ(read_corpus_entries({b}), (Entries{"x", "y\nz"}));
    // a big one, past the inflate buffer
    std::string big;
    for (int i = 0; i < 20000; ++i) big += "{\"text\": \"entry " + std::to_string(i) + "\"}\n";
    const Entries entries = read_corpus_entries({dir.write("c.jsonl.gz", gzip(big))});
    ASSERT_EQ(entries.size(), 20000u);
    EXPECT_EQ(entries.back(), "entry 19999");
}

// The reader streams a chunk (1 MiB) at a time: lines across chunks, a line longer than a chunk,
// no newline at the end, an array after more than a chunk of whitespace; plain and gzipped.
TEST(Corpus, JsonLinesAcrossChunks) {
    TempDir dir;
    Entries expected;
    std::string jsonl;
    for (int i = 0; i < 60; ++i) {
        std::string text = "doc " + std::to_string(i) + " ";
        text.append(static_cast<size_t>(i % 7 == 3 ? (1 << 20) + 77 : 50'000 + 131 * i),
                    static_cast<char>('a' + i % 26));
        expected.push_back(text);
        jsonl += nlohmann::json{{"text", text}}.dump() + (i % 5 == 0 ? "\r\n\n" : "\n");
    }
    jsonl.pop_back();  // the last line without its newline
    ASSERT_GT(jsonl.size(), 4u << 20);
    EXPECT_EQ(read_corpus_entries({dir.write("a.jsonl", jsonl)}), expected);
    EXPECT_EQ(read_corpus_entries({dir.write("b.jsonl.gz", gzip(jsonl))}), expected);
    // an error's line number counts every line, blank ones included, across chunks
    const std::string bad = dir.write("c.jsonl", jsonl + "\n{\"id\": 1}\n");
    expect_input_error([&] { read_corpus_entries({bad}); }, {bad + ":73", "no field"});

    const std::string spaced = std::string((1 << 20) + 5, ' ') + "\n[{\"text\": \"x\"}]";
    EXPECT_EQ(read_corpus_entries({dir.write("d.json", spaced)}), (Entries{"x"}));
    EXPECT_EQ(read_corpus_entries({dir.write("e.json.gz", gzip(spaced))}), (Entries{"x"}));
    EXPECT_EQ(read_corpus_entries({dir.write("f.jsonl", "")}), Entries{});
    EXPECT_EQ(read_corpus_entries({dir.write("g.jsonl.gz", gzip(""))}), Entries{});
}

TEST(Corpus, BrokenGzipIsAnErrorNamingTheFile) {
    TempDir dir;
    const std::string z   = gzip("{\"text\": \"one\"}\n");
    const std::string cut = dir.write("cut.jsonl.gz", z.substr(0, z.size() - 6));
    expect_input_error([&] { read_corpus_entries({cut}); }, {cut, "not valid gzip", "truncated"});
    std::string flipped = z;
    flipped[z.size() - 5] ^= 0x40;  // the CRC-32 or length in the trailer
    const std::string crc = dir.write("crc.jsonl.gz", flipped);
    expect_input_error([&] { read_corpus_entries({crc}); }, {crc, "not valid gzip"});
    const std::string tail = dir.write("tail.jsonl.gz", z + "junk");
    expect_input_error([&] { read_corpus_entries({tail}); }, {tail, "4 bytes after the gzip data"});
    // in a folder too: a file that is gzip is read, and broken is an error
    dir.write("folder/d.gz", z.substr(0, 12));
    expect_input_error([&] { read_corpus_entries({dir.path("folder")}); },
                       {dir.path("folder/d.gz"), "not valid gzip"});
}

TEST(Corpus, ListingHasSizesAndTimesInReadingOrder) {
    TempDir dir;
    dir.write("f/b", "bb\n");
    dir.write("f/a", "a\n");
    const std::string one               = dir.write("one.jsonl", "{\"text\": \"1\"}\n");
    const std::vector<CorpusFile> files = list_corpus_files({dir.path("f"), one});
    ASSERT_EQ(files.size(), 3u);
    EXPECT_EQ(files[0].path, dir.path("f/a"));
    EXPECT_FALSE(files[0].named);
    EXPECT_EQ(files[1].bytes, 3);
    EXPECT_EQ(files[2].path, one);
    EXPECT_TRUE(files[2].named);
    EXPECT_GT(files[2].mtime_ns, 0);
    EXPECT_TRUE(is_json_corpus_file("x.jsonl.gz"));
    EXPECT_TRUE(is_json_corpus_file("x.ndjson"));
    EXPECT_FALSE(is_json_corpus_file("x.txt.gz"));
    EXPECT_FALSE(is_json_corpus_file("jsonl"));
}

}  // namespace
}  // namespace bagualu::data
