// preprocess / merge / inspect against an independent reader of the .idx/.bin format
// (test_helpers.h), with the small tokenizer.json of the tokenizer tests.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data_tools/inspect.h"
#include "data_tools/merge.h"
#include "data_tools/preprocess.h"
#include "test_helpers.h"

using namespace mt::data;
using dt_test::error_of;
using dt_test::TempDir;
using Ids = std::vector<int32_t>;

namespace {

// Unicode, an empty document, escapes (\n \" \\ \t \u00e9, a surrogate pair), a list of sentences.
const char* kJsonl =
    "{\"text\": \"hello world\", \"id\": 1}\n"
    "{\"text\": \"caf\\u00e9 \\ud83d\\ude00 \\\"quoted\\\" back\\\\slash\\ttab\\nnew line\"}\n"
    "{\"text\": \"\"}\n"
    "{\"id\": 4, \"text\": \"\\u65e5\\u672c\\u8a9e I'M 12345\"}\n"
    "   \n"
    "{\"text\": [\"first sentence.\", \"\", \"second one\"]}\n"
    "{\"text\": \"last line without newline\"}";

struct Fixture {
  TempDir dir;
  std::string tokenizer;
  explicit Fixture(const std::string& name) : dir(name), tokenizer(dir / "tokenizer.json") {
    dt_test::write_file(tokenizer, dt_test::small_tokenizer_json(dt_test::Style::kGpt2).dump());
  }
  PreprocessOptions options(const std::vector<std::string>& inputs, const std::string& out) const {
    PreprocessOptions o;
    o.inputs = inputs;
    o.tokenizer.type = "hf-json";
    o.tokenizer.tokenizer_file = tokenizer;
    o.append_eod = true;
    o.output_prefix = dir / out;
    o.log_interval = 0;
    return o;
  }
};


bool any_output(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find("_document") != std::string::npos) return true;  // final or temporary names
  }
  return false;
}

void write_gz(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
  gzclose(f);
}

// The bytes Megatron-Core's _IndexWriter writes for these sequence lengths / document indices.
std::string megatron_idx_bytes(uint8_t code, int esize, const std::vector<int32_t>& lengths, const std::vector<int64_t>& docs) {
  std::string s("MMIDIDX\0\0", 9);
  auto put = [&](const void* p, size_t n) { s.append(static_cast<const char*>(p), n); };
  const uint64_t version = 1, S = lengths.size(), D = docs.size();
  put(&version, 8);
  put(&code, 1);
  put(&S, 8);
  put(&D, 8);
  put(lengths.data(), 4 * S);
  int64_t ptr = 0;
  for (int32_t l : lengths) {
    put(&ptr, 8);
    ptr += static_cast<int64_t>(l) * esize;
  }
  put(docs.data(), 8 * D);
  return s;
}

}  // namespace

TEST_CASE("preprocess: tokens, EOD, empty documents and sentence lists, read back independently", "[preprocess]") {
  Fixture fx("pp_basic");
  dt_test::write_file(fx.dir / "in.jsonl", kJsonl);
  const auto st = preprocess(fx.options({fx.dir / "in.jsonl"}, "out"));
  CHECK(st.documents == 6);
  CHECK(st.blank_lines == 1);
  CHECK(st.dtype == "uint16");
  REQUIRE(st.output_prefixes == std::vector<std::string>{fx.dir / "out_text_document"});
  CHECK(std::filesystem::exists(fx.dir / "out_text_document.bin"));
  CHECK_FALSE(std::filesystem::exists(fx.dir / "out_text_document.bin.tmp"));

  // Expected, as preprocess_data.py: tokens of each sentence, EOD on the last, empty doc recorded.
  auto tok = make_tokenizer(fx.options({}, "x").tokenizer);
  const std::vector<std::vector<std::string>> docs = {
      {"hello world"},
      {"caf\u00e9 \U0001F600 \"quoted\" back\\slash\ttab\nnew line"},
      {},
      {"\u65e5\u672c\u8a9e I'M 12345"},
      {"first sentence.", "second one"},
      {"last line without newline"}};
  std::vector<Ids> seqs;
  std::vector<int32_t> lengths;
  std::vector<int64_t> doc_indices = {0};
  for (const auto& d : docs) {
    for (size_t i = 0; i < d.size(); ++i) {
      Ids ids = tok->encode(d[i]);
      if (i + 1 == d.size()) ids.push_back(270);  // <|endoftext|>
      lengths.push_back(static_cast<int32_t>(ids.size()));
      seqs.push_back(ids);
    }
    doc_indices.push_back(static_cast<int64_t>(seqs.size()));
  }
  const dt_test::RawDataset raw = dt_test::read_raw_dataset(fx.dir / "out_text_document");
  CHECK(raw.dtype_code == 8);  // uint16
  CHECK(raw.doc_indices == doc_indices);
  CHECK(raw.doc_indices[3] == raw.doc_indices[2]);  // the empty document
  REQUIRE(raw.sequences.size() == seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) CHECK(raw.sequences[i] == std::vector<int64_t>(seqs[i].begin(), seqs[i].end()));
  // Byte for byte what Megatron-Core's builder writes for these ids.
  CHECK(dt_test::read_file(fx.dir / "out_text_document.idx") == megatron_idx_bytes(8, 2, lengths, doc_indices));
  std::string bin;
  for (const Ids& s : seqs)
    for (int32_t t : s) bin.append(reinterpret_cast<const char*>(&t), 2);  // little-endian uint16
  CHECK(dt_test::read_file(fx.dir / "out_text_document.bin") == bin);
  // megatrain's reader agrees.
  IndexedDataset ds(fx.dir / "out_text_document");
  CHECK(ds.num_documents() == 6);
  CHECK(ds.num_sequences() == static_cast<int64_t>(seqs.size()));
}

TEST_CASE("preprocess: output does not depend on workers or chunking; .gz equals plain; several inputs", "[preprocess]") {
  Fixture fx("pp_workers");
  std::string big;
  for (int i = 0; i < 300; ++i)
    big += "{\"text\": \"document " + std::to_string(i) + ": hello world, I'M " + std::string(i % 17, 'x') +
           " caf\\u00e9\", \"title\": \"t" + std::to_string(i) + "\"}\n";
  dt_test::write_file(fx.dir / "a.jsonl", big);
  write_gz(fx.dir / "a.jsonl.gz", big);
  const size_t cut = big.find('\n', big.size() / 2) + 1;
  dt_test::write_file(fx.dir / "b1.jsonl", big.substr(0, cut));
  dt_test::write_file(fx.dir / "b2.jsonl", big.substr(cut));
  auto run = [&](const std::vector<std::string>& in, const std::string& out, int workers, size_t chunk) {
    auto o = fx.options(in, out);
    o.workers = workers;
    o.chunk_bytes = chunk;
    o.json_keys = {"text", "title"};
    preprocess(o);
    return dt_test::read_file(fx.dir / (out + "_text_document.bin")) + dt_test::read_file(fx.dir / (out + "_text_document.idx")) +
           dt_test::read_file(fx.dir / (out + "_title_document.bin")) + dt_test::read_file(fx.dir / (out + "_title_document.idx"));
  };
  const std::string ref = run({fx.dir / "a.jsonl"}, "w1", 1, size_t{1} << 20);
  CHECK(run({fx.dir / "a.jsonl"}, "w2", 2, 200) == ref);
  CHECK(run({fx.dir / "a.jsonl"}, "w3", 3, 1) == ref);
  CHECK(run({fx.dir / "a.jsonl.gz"}, "gz", 2, 500) == ref);
  CHECK(run({fx.dir / "b1.jsonl", fx.dir / "b2.jsonl"}, "two", 2, 300) == ref);
  CHECK(dt_test::read_raw_dataset(fx.dir / "w1_title_document").sequences.size() == 300);
}

TEST_CASE("preprocess: bad lines are errors with file:line, or skipped and counted", "[preprocess]") {
  Fixture fx("pp_bad");
  const std::string in = fx.dir / "bad.jsonl";
  dt_test::write_file(in, "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"broken\n{\"txt\": \"no key\"}\n"
                          "[1, 2]\n{\"text\": 5}\n{\"text\": \"fine\"}\n");
  auto o = fx.options({in}, "out");
  o.workers = 2;
  o.chunk_bytes = 16;
  std::string err = error_of([&] { preprocess(o); });
  CHECK_THAT(err, dt_test::has_text(in + ":3: malformed JSON") && dt_test::has_text("--skip-bad"));
  CHECK_FALSE(any_output(fx.dir.path.string()));

  dt_test::write_file(in, "{\"text\": \"ok\"}\n{\"txt\": \"no key\"}\n");
  CHECK_THAT(error_of([&] { preprocess(o); }),
             dt_test::has_text(in + ":2: no key \"text\"") && dt_test::has_text("--json-keys"));
  dt_test::write_file(in, "{\"text\": [\"a\", 3]}\n");
  CHECK_THAT(error_of([&] { preprocess(o); }), dt_test::has_text(in + ":1: \"text\" is a list holding a number"));
  CHECK_FALSE(any_output(fx.dir.path.string()));

  dt_test::write_file(in, "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\": \"broken\n{\"txt\": \"no key\"}\n"
                          "[1, 2]\n{\"text\": 5}\n{\"text\": \"fine\"}\n");
  o.skip_bad = true;
  const auto st = preprocess(o);
  CHECK(st.bad_lines == 4);
  CHECK(st.documents == 3);
  CHECK(dt_test::read_raw_dataset(fx.dir / "out_text_document").doc_indices.size() == 4);
}

TEST_CASE("preprocess: a failing run leaves no dataset under the final names", "[preprocess]") {
  Fixture fx("pp_fail");
  std::string many;
  for (int i = 0; i < 2000; ++i) many += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  dt_test::write_file(fx.dir / "good.jsonl", many);
  dt_test::write_file(fx.dir / "late_bad.jsonl", many + "{not json}\n");
  auto o = fx.options({fx.dir / "good.jsonl", fx.dir / "late_bad.jsonl"}, "out");
  o.workers = 2;
  o.chunk_bytes = 1000;
  CHECK_THAT(error_of([&] { preprocess(o); }), dt_test::has_text("late_bad.jsonl:2001: malformed JSON"));
  CHECK_FALSE(any_output(fx.dir.path.string()));
  // A truncated gzip file.
  std::string gz;
  write_gz(fx.dir / "full.gz", many);
  gz = dt_test::read_file(fx.dir / "full.gz");
  dt_test::write_file(fx.dir / "cut.gz", gz.substr(0, gz.size() / 2));
  o.inputs = {fx.dir / "cut.gz"};
  CHECK_THAT(error_of([&] { preprocess(o); }), dt_test::has_text("cut.gz:") && dt_test::has_text("corrupt or truncated"));
  CHECK_FALSE(any_output(fx.dir.path.string()));
  // A missing input is found before anything is written; cancellation stops a run.
  o.inputs = {fx.dir / "good.jsonl", fx.dir / "missing.jsonl"};
  CHECK_THAT(error_of([&] { preprocess(o); }), dt_test::has_text("missing.jsonl: cannot read the input file"));
  std::atomic<bool> cancel{true};
  o.inputs = {fx.dir / "good.jsonl"};
  CHECK_THAT(error_of([&] { preprocess(o, &cancel); }), dt_test::has_text("interrupted"));
  CHECK_FALSE(any_output(fx.dir.path.string()));
}

TEST_CASE("preprocess: int32 tokens for a vocabulary of 65500 ids or more", "[preprocess]") {
  Fixture fx("pp_int32");
  auto j = dt_test::small_tokenizer_json(dt_test::Style::kGpt2);
  j["added_tokens"].push_back({{"id", 65500}, {"content", "<big>"}, {"special", true}});
  dt_test::write_file(fx.tokenizer, j.dump());
  dt_test::write_file(fx.dir / "in.jsonl", "{\"text\": \"hello<big>\"}\n");
  const auto st = preprocess(fx.options({fx.dir / "in.jsonl"}, "out"));
  CHECK(st.dtype == "int32");
  const auto raw = dt_test::read_raw_dataset(fx.dir / "out_text_document");
  CHECK(raw.dtype_code == 4);
  CHECK(raw.sequences.at(0) == std::vector<int64_t>{259, 65500, 270});
}

TEST_CASE("merge equals preprocessing the concatenated input; inspect reports it", "[preprocess][merge]") {
  Fixture fx("pp_merge");
  std::string a, b;
  for (int i = 0; i < 50; ++i) a += "{\"text\": \"first file " + std::to_string(i) + "\"}\n";
  for (int i = 0; i < 30; ++i) b += "{\"text\": \"" + std::string(i == 3 ? "" : "second hello world ") + std::to_string(i) + "\"}\n";
  b += "{\"text\": \"\"}\n";
  dt_test::write_file(fx.dir / "a.jsonl", a);
  dt_test::write_file(fx.dir / "b.jsonl", b);
  dt_test::write_file(fx.dir / "ab.jsonl", a + b);
  preprocess(fx.options({fx.dir / "a.jsonl"}, "a"));
  preprocess(fx.options({fx.dir / "b.jsonl"}, "b"));
  preprocess(fx.options({fx.dir / "ab.jsonl"}, "ab"));
  const auto st = merge_datasets({fx.dir / "a_text_document", fx.dir / "b_text_document"}, fx.dir / "merged");
  CHECK(st.documents == 81);
  CHECK(dt_test::read_file(fx.dir / "merged.idx") == dt_test::read_file(fx.dir / "ab_text_document.idx"));
  CHECK(dt_test::read_file(fx.dir / "merged.bin") == dt_test::read_file(fx.dir / "ab_text_document.bin"));
  CHECK_THAT(error_of([&] { merge_datasets({fx.dir / "a_text_document"}, fx.dir / "a_text_document"); }),
             dt_test::has_text("is also an input"));

  InspectOptions io;
  io.prefix = fx.dir / "merged";
  io.tokenizer = fx.options({}, "x").tokenizer;
  io.samples = 2;
  std::ostringstream out;
  inspect_dataset(io, out);
  const std::string report = out.str();
  CHECK_THAT(report, dt_test::has_text("dtype       uint16"));
  CHECK_THAT(report, dt_test::has_text("documents   81 (1 empty)"));
  CHECK_THAT(report, dt_test::has_text("sequence length (tokens): min"));
  CHECK_THAT(report, dt_test::has_text("\"first file 0<|endoftext|>\""));
}

// Issue #20: a UTF-8 byte order mark was a "malformed JSON" error; an empty input wrote an empty
// dataset with exit 0.
TEST_CASE("preprocess: a UTF-8 BOM is accepted; an input without documents is refused", "[preprocess]") {
  Fixture fx("pp_bom");
  const std::string plain = fx.dir / "plain.jsonl", bom = fx.dir / "bom.jsonl";
  dt_test::write_file(plain, "{\"text\": \"hello world\"}\n{\"text\": \"second\"}\n");
  dt_test::write_file(bom, "\xEF\xBB\xBF{\"text\": \"hello world\"}\n{\"text\": \"second\"}\n");
  preprocess(fx.options({plain}, "a"));
  preprocess(fx.options({bom}, "b"));
  CHECK(dt_test::read_file(fx.dir / "a_text_document.bin") == dt_test::read_file(fx.dir / "b_text_document.bin"));
  CHECK(dt_test::read_file(fx.dir / "a_text_document.idx") == dt_test::read_file(fx.dir / "b_text_document.idx"));
  // Only at the start of the file: elsewhere it is text inside a line, and bad JSON.
  dt_test::write_file(bom, "{\"text\": \"a\"}\n\xEF\xBB\xBF{\"text\": \"b\"}\n");
  CHECK_THAT(error_of([&] { preprocess(fx.options({bom}, "c")); }), dt_test::has_text(bom + ":2: malformed JSON"));

  Fixture ef("pp_empty");
  for (const std::string& text : {std::string(), std::string("\n\n  \n"), std::string("\xEF\xBB\xBF")}) {
    const std::string in = ef.dir / "empty.jsonl";
    dt_test::write_file(in, text);
    CHECK_THAT(error_of([&] { preprocess(ef.options({in}, "out")); }),
               dt_test::has_text("no documents") && dt_test::has_text("nothing was written"));
    CHECK_FALSE(any_output(ef.dir.path.string()));
  }
  // Every line bad and skipped: no documents either.
  const std::string bad = ef.dir / "bad.jsonl";
  dt_test::write_file(bad, "{oops}\n[1]\n");
  auto o = ef.options({bad}, "out");
  o.skip_bad = true;
  CHECK_THAT(error_of([&] { preprocess(o); }), dt_test::has_text("2 skipped as bad"));
  // Documents whose texts are all empty: no tokens.
  dt_test::write_file(bad, "{\"text\": \"\"}\n{\"text\": []}\n");
  o = ef.options({bad}, "out");
  o.append_eod = true;  // EOD follows non-empty documents only
  CHECK_THAT(error_of([&] { preprocess(o); }), dt_test::has_text("have no tokens"));
  CHECK_FALSE(any_output(ef.dir.path.string()));
}

// This process's resident set (VmRSS of /proc/self/status), MB.
double resident_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // "VmRSS:   1234 kB"
  FAIL("no VmRSS in /proc/self/status");
  return 0;
}

// Issue #20: one 50 MB line took 1-1.9 GB (the pre-tokenizer held 12 bytes per character and every
// piece of the text). Run in a child process so that its peak resident set (ru_maxrss) is this
// run's (less the pages it started with); the output is checked against the same text split into many short
// documents.
TEST_CASE("preprocess: one 50 MB line runs in bounded memory", "[preprocess][memory]") {
  Fixture fx("pp_huge");
  const std::string in = fx.dir / "huge.jsonl";
  const size_t kBytes = 50u << 20;
  std::string text;
  text.reserve(kBytes + 64);
  text = "{\"text\": \"";
  const std::string words[] = {"hello world ", "café 12345 ", "I'M xyz ", "hello, world! "};
  for (size_t k = 0; text.size() < kBytes; ++k) text += words[k % 4];
  text += "end\"}\n";
  dt_test::write_file(in, text);
  const size_t line_bytes = text.size();
  std::string().swap(text);
  auto o = fx.options({in}, "huge");
  o.workers = 2;
  std::fflush(nullptr);
  // The child starts with this process's resident pages (in a CUDA build, the CUDA libraries and our kernels'
  // images, ~100 MB that megatrain-data itself never loads): its peak minus that is the preprocess's own.
  const double base_mb = resident_mb();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    try {
      const auto st = preprocess(o);
      code = st.documents == 1 ? 0 : 3;
    } catch (...) {
      code = 4;
    }
    _exit(code);
  }
  int status = 0;
  struct rusage ru {};
  REQUIRE(wait4(pid, &status, 0, &ru) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const double peak_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
  std::printf("preprocess: one %.1f MB line: peak RSS %.0f MB, %.0f MB above the %.0f MB the child started with\n",
              line_bytes / 1048576.0, peak_mb, peak_mb - base_mb, base_mb);
  CHECK(peak_mb - base_mb < 300);
  // The tokens are those of the pieces (a 4-word sentence repeated): spot-check the sequence length.
  const auto ds = dt_test::read_raw_dataset(fx.dir / "huge_text_document");
  REQUIRE(ds.lengths.size() == 1);
  CHECK(ds.lengths[0] > static_cast<int64_t>(line_bytes / 8));
}
