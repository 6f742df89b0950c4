// Reliability suite (issue #20, item 8): bad input never crashes and is never silently accepted.
//   * >= 1,000 generated bad configs, mutations of every shipped config, each through
//     `megatrain config --config FILE` (the binary, as a user runs it): no signal death, exit 0
//     (a mutation that happens to be valid) or 1 with exactly one line on stderr naming the file;
//     mutations that are always wrong (unknown key, broken YAML, a second document, a tag, a
//     duplicate key, a type error in a number key) must be refused.
//   * Data corruption: every truncation and many byte edits of a .idx/.bin open to a clear
//     mt::Error or a dataset whose every sequence reads within bounds; every kind of sample-index
//     cache corruption is rebuilt (identical to a fresh build).
// The counts are printed (the README's reliability section quotes them).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "common/run_binary.h"
#include "core/check.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"

extern char** environ;

using namespace mt::test;

namespace {

std::vector<std::string> shipped_configs() {
  std::vector<std::string> out;
  for (const char* dir : {"configs", "configs/ci"})
    for (const auto& e : fs::directory_iterator(source_path(dir)))
      if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream ss(text);
  std::string l;
  while (std::getline(ss, l)) lines.push_back(l);
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

bool is_key_line(const std::string& l) {  // "  key: value" (indented, a value, not a comment)
  if (l.size() < 3 || l[0] != ' ' || l.find_first_not_of(' ') == std::string::npos) return false;
  const std::string t = l.substr(l.find_first_not_of(' '));
  const auto colon = t.find(':');
  return t[0] != '#' && t[0] != '-' && colon != std::string::npos && colon + 1 < t.size() &&
         t.find_first_not_of(" ", colon + 1) != std::string::npos && t[t.find_first_not_of(" ", colon + 1)] != '#';
}

struct Mutant {
  std::string kind;
  std::string text;
  bool must_fail;  // always wrong, whatever the key
};

// Mutations of one config. rng picks lines and values; every kind appears for every file.
std::vector<Mutant> mutate(const std::string& text, std::mt19937_64& rng, int per_kind) {
  const std::vector<std::string> lines = split_lines(text);
  std::vector<size_t> keys, sections;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (is_key_line(lines[i])) keys.push_back(i);
    if (!lines[i].empty() && lines[i][0] != ' ' && lines[i][0] != '#') sections.push_back(i);
  }
  REQUIRE(!keys.empty());
  auto pick = [&](const std::vector<size_t>& v) { return v[rng() % v.size()]; };
  auto key_of = [&](const std::string& l) { return l.substr(0, l.find(':')); };
  auto with_value = [&](size_t i, const std::string& v) {
    auto copy = lines;
    copy[i] = key_of(lines[i]) + ": " + v;
    return join(copy);
  };
  const std::vector<std::string> wrong_types = {"abc", "[1, 2]", "{a: 1}", "\"\"", "yes please", "1.5.5", "0x1G",
                                                "- 1", "true false", "[", "null"};
  const std::vector<std::string> bad_numbers = {"-1",    "0",     "-0.5",  "1e400", "-1e400",
                                                "99999999999999999999999", "-99999999999999999999", ".nan",
                                                ".inf",  "-.inf", "2147483648", "9223372036854775808",
                                                "1e-400", "0.0000001", "4294967297"};
  const std::vector<std::string> unicode = {"ü", "日本語", "\xF0\x9F\x98\x80", "\xE2\x80\x8B", "Ω1", "１２"};
  std::vector<Mutant> out;
  for (int r = 0; r < per_kind; ++r) {
    {  // unknown key
      auto c = lines;
      c.insert(c.begin() + static_cast<long>(pick(sections)) + 1, "  bogus_key_" + std::to_string(rng() % 1000) + ": 1");
      out.push_back({"unknown key", join(c), true});
    }
    out.push_back({"wrong type", with_value(pick(keys), wrong_types[rng() % wrong_types.size()]), false});
    out.push_back({"out of range / huge", with_value(pick(keys), bad_numbers[rng() % bad_numbers.size()]), false});
    out.push_back({"unicode value", with_value(pick(keys), unicode[rng() % unicode.size()]), false});
    {  // unicode in a key name: never a known key
      auto c = lines;
      const size_t i = pick(keys);
      c[i].insert(c[i].find_first_not_of(' ') + 1, unicode[rng() % unicode.size()]);
      out.push_back({"unicode key", join(c), true});
    }
    {  // a line deleted (a required key, a section header, ...)
      auto c = lines;
      c.erase(c.begin() + static_cast<long>(rng() % c.size()));
      out.push_back({"missing line", join(c), false});
    }
    {  // a key given twice
      auto c = lines;
      const size_t i = pick(keys);
      c.insert(c.begin() + static_cast<long>(i) + 1, lines[i]);
      out.push_back({"duplicate key", join(c), true});
    }
    {  // a section given twice
      auto c = lines;
      const size_t i = pick(sections);
      c.push_back(lines[i]);
      c.push_back("  seed: 1");
      out.push_back({"duplicate section", join(c), true});
    }
    {  // broken YAML
      static const std::vector<std::string> broken = {"  oops: [1, 2", "  oops: \"unterminated", "\tkey: 1",
                                                      ": : :", "  - just a list item", "  {"};
      auto c = lines;
      c.insert(c.begin() + static_cast<long>(pick(keys)) + 1, broken[rng() % broken.size()]);
      out.push_back({"broken YAML", join(c), true});
    }
    out.push_back({"second document", text + "---\n" + lines[pick(sections)] + "\n", true});
    out.push_back({"tag", with_value(pick(keys), std::string(rng() % 2 ? "!!str " : "!!float ") + "1"), true});
    {  // truncated at a random byte
      const size_t cut = rng() % text.size();
      out.push_back({"truncated", text.substr(0, cut), false});
    }
    {  // a random byte replaced
      std::string t = text;
      t[rng() % t.size()] = static_cast<char>(rng() % 256);
      out.push_back({"byte edit", t, false});
    }
    {  // a number key given text: find a line whose value is a plain number
      std::vector<size_t> numeric;
      for (size_t i : keys) {
        std::string v = lines[i].substr(lines[i].find(':') + 1);
        v = v.substr(0, v.find('#'));
        v.erase(0, v.find_first_not_of(' '));
        v.erase(v.find_last_not_of(' ') + 1);
        if (!v.empty() && v.find_first_not_of("0123456789.e-+") == std::string::npos) numeric.push_back(i);
      }
      if (!numeric.empty()) out.push_back({"number as text", with_value(pick(numeric), "twelve"), true});
    }
  }
  out.push_back({"empty file", "", false});
  out.push_back({"only a comment", "# nothing\n", false});
  out.push_back({"a scalar document", "42\n", true});
  out.push_back({"a list document", "- model\n- training\n", true});
  return out;
}

struct Outcome {
  bool signaled = false;
  int code = 0;
  std::string err;
};

// Starts megatrain config --config FILE with stdout to /dev/null and stderr to err_file.
pid_t spawn_config(const std::string& file, const std::string& err_file) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> args = {megatrain_bin(), "config", "--config", file};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

Outcome finish_config(pid_t pid, const std::string& err_file) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  Outcome o;
  o.signaled = WIFSIGNALED(status);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.err = read_file(err_file);
  return o;
}

}  // namespace

TEST_CASE("reliability: >= 1,000 generated bad configs through `megatrain config`: no crash, one line", "[reliability]") {
  const fs::path dir = temp_dir() / "reliability_configs";
  fs::create_directories(dir);
  std::mt19937_64 rng(20);
  std::vector<Mutant> all;
  const auto configs = shipped_configs();
  REQUIRE(configs.size() >= 5);
  for (const auto& c : configs) {
    auto m = mutate(read_file(c), rng, 9);
    all.insert(all.end(), m.begin(), m.end());
  }
  REQUIRE(all.size() >= 1000);
  std::map<std::string, std::array<int, 2>> by_kind;  // refused, accepted
  int crashes = 0, bad_exit = 0, not_one_line = 0, unnamed = 0, wrongly_accepted = 0, refused = 0, accepted = 0;
  constexpr size_t kParallel = 4;  // processes at a time (each mostly waits on start-up)
  auto file_of = [&](size_t i) {
    std::string name = "m";  // (not "m" + to_string: g++ 12 warns, -Wrestrict, falsely)
    name += std::to_string(i);
    return (dir / (name + ".yaml")).string();
  };
  auto err_of = [&](size_t i) { return (dir / ("err" + std::to_string(i % kParallel) + ".txt")).string(); };
  std::vector<Outcome> outcomes(all.size());
  for (size_t b = 0; b < all.size(); b += kParallel) {
    std::vector<pid_t> pids;
    for (size_t i = b; i < std::min(all.size(), b + kParallel); ++i) {
      std::ofstream(file_of(i), std::ios::binary) << all[i].text;
      pids.push_back(spawn_config(file_of(i), err_of(i)));
    }
    for (size_t i = b; i < b + pids.size(); ++i) outcomes[i] = finish_config(pids[i - b], err_of(i));
  }
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string file = file_of(i);
    const Outcome& o = outcomes[i];
    INFO("mutation " << i << " (" << all[i].kind << "): " << file << "\n" << o.err);
    if (o.signaled) ++crashes;
    CHECK_FALSE(o.signaled);
    if (o.code == 0) {
      ++accepted;
      ++by_kind[all[i].kind][1];
      if (all[i].must_fail) ++wrongly_accepted;
      CHECK_FALSE(all[i].must_fail);
      fs::remove(file);
      continue;
    }
    ++refused;
    ++by_kind[all[i].kind][0];
    if (o.code != 1) ++bad_exit;
    CHECK(o.code == 1);
    if (count_lines(o.err) != 1) ++not_one_line;
    CHECK(count_lines(o.err) == 1);
    if (o.err.find(file) == std::string::npos) ++unnamed;
    CHECK(o.err.find(file) != std::string::npos);
    fs::remove(file);
  }
  std::printf("reliability: %zu generated configs from %zu shipped ones: %d refused, %d accepted (valid after the "
              "mutation); %d crashes, %d other exit codes, %d not one line, %d not naming the file, %d wrongly "
              "accepted\n",
              all.size(), configs.size(), refused, accepted, crashes, bad_exit, not_one_line, unnamed,
              wrongly_accepted);
  for (const auto& [k, v] : by_kind) std::printf("  %-20s refused %4d, accepted %4d\n", k.c_str(), v[0], v[1]);
  CHECK(crashes == 0);
  CHECK(wrongly_accepted == 0);
}

TEST_CASE("reliability: truncated and edited .idx/.bin files are an error or read within bounds", "[reliability]") {
  using namespace mt::data;
  const fs::path dir = temp_dir() / "reliability_data";
  fs::create_directories(dir);
  const std::string good = (dir / "good").string();
  {
    IndexedDatasetWriter w(good, mt::DType::U16);
    uint32_t x = 3;
    for (int d = 0; d < 12; ++d) {
      std::vector<int32_t> t(1 + d * 3);
      for (auto& v : t) v = static_cast<int32_t>((x = x * 1664525u + 1013904223u) >> 20);
      w.add_item(t.data(), static_cast<int64_t>(t.size()));
      if (d % 2) w.add_item(t.data(), 2);
      w.end_document();
    }
    w.finalize();
  }
  const std::string idx = read_file(good + ".idx"), bin = read_file(good + ".bin");
  int cases = 0, errors = 0, opened = 0;
  // Opens PREFIX and reads every sequence; false when an mt::Error said what was wrong.
  auto probe = [&](const std::string& i_bytes, const std::string& b_bytes) {
    const std::string p = (dir / "bad").string();
    std::ofstream(p + ".idx", std::ios::binary | std::ios::trunc) << i_bytes;
    std::ofstream(p + ".bin", std::ios::binary | std::ios::trunc) << b_bytes;
    ++cases;
    try {
      IndexedDataset ds(p);
      for (int64_t s = 0; s < ds.num_sequences(); ++s) {
        std::vector<int32_t> out(static_cast<size_t>(std::max<int32_t>(ds.sequence_length(s), 0)));
        ds.read(s, 0, ds.sequence_length(s), out.data());
      }
      ++opened;
    } catch (const mt::Error& e) {
      ++errors;
      const std::string msg = e.what();
      CHECK(msg.find(p) != std::string::npos);
      CHECK(msg.find('\n') == std::string::npos);
    }
  };
  for (size_t n = 0; n < idx.size(); ++n) probe(idx.substr(0, n), bin);           // every truncation of the .idx
  for (size_t n = 0; n < bin.size(); n += 3) probe(idx, bin.substr(0, n));        // of the .bin
  std::mt19937_64 rng(7);
  for (size_t k = 0; k < idx.size(); ++k) {  // every byte of the .idx, edited
    std::string e = idx;
    e[k] = static_cast<char>(e[k] ^ (1 + rng() % 255));
    probe(e, bin);
  }
  for (int k = 0; k < 100; ++k) {  // .bin bytes: still a dataset (token values are data)
    std::string e = bin;
    e[rng() % e.size()] ^= static_cast<char>(1 + rng() % 255);
    probe(idx, e);
  }
  std::printf("reliability: %d corrupted .idx/.bin pairs: %d refused with an error naming the file, %d opened and "
              "read within bounds, 0 crashes\n",
              cases, errors, opened);
  CHECK(cases == errors + opened);
  CHECK(errors >= static_cast<int>(idx.size() + bin.size() / 3));  // every truncation at least
}
