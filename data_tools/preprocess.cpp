// The preprocess pipeline: reader thread -> worker threads -> ordered writer (see preprocess.h).
#include "data_tools/preprocess.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "data_tools/json_line.h"
#include "data_tools/jsonl_reader.h"

namespace mt::data {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxWarnings = 10;  // bad lines reported one by one with --skip-bad

// Tokens of one JSON key for the documents of a chunk.
struct KeyOutput {
  std::vector<int32_t> tokens;    // all sequences back to back
  std::vector<int32_t> seq_lens;  // tokens per sequence
  std::vector<int32_t> doc_seqs;  // sequences per document (0 for an empty document)
};

// A chunk of consecutive lines of one file; workers add the tokens and free the text.
struct Chunk {
  int64_t seq = 0;  // position in the input order
  std::string file;
  int64_t first_line = 0;  // line number of the first line
  std::string text;        // the lines, each without '\n'
  std::vector<size_t> ends;  // end offset of each line in text
  int64_t input_bytes = 0;   // uncompressed bytes, with newlines
  int64_t progress_pos = 0;  // input bytes (compressed) consumed up to the chunk's end, all files
  std::string error;         // read error (reader) or bad line (worker): stops the run, in order
  std::vector<KeyOutput> out;
  int64_t documents = 0, bad = 0, blank = 0;
  std::vector<std::string> warnings;
};

// Parses and tokenizes the chunk's lines. Bad lines: an error (stops the run) or, with
// skip_bad, skipped whole (every key) and counted.
void encode_chunk(Chunk& c, const PreprocessOptions& o, Tokenizer& tok) {
  c.out.assign(o.json_keys.size(), KeyOutput{});
  JsonLineParser parser(o.json_keys);
  size_t begin = 0;
  for (size_t i = 0; i < c.ends.size(); begin = c.ends[i], ++i) {
    const std::string_view line(c.text.data() + begin, c.ends[i] - begin);
    const int64_t line_no = c.first_line + static_cast<int64_t>(i);
    if (line.find_first_not_of(" \t\r\n") == std::string_view::npos) { ++c.blank; continue; }
    std::string problem = parser.parse(line);
    if (!problem.empty() && !problem.starts_with("expected a JSON object")) problem = "malformed JSON: " + problem;
    for (size_t k = 0; k < o.json_keys.size() && problem.empty(); ++k) {
      const JsonField& f = parser.fields()[k];
      if (f.kind == JsonField::kMissing)
        problem = "no key \"" + o.json_keys[k] + "\" in this JSON object; choose the key with --json-keys";
      else if (f.kind == JsonField::kOther)
        problem = "\"" + o.json_keys[k] + "\" is " + f.other + ", expected a string or a list of strings";
    }
    if (!problem.empty()) {
      const std::string msg = c.file + ":" + std::to_string(line_no) + ": " + problem;
      if (!o.skip_bad) {
        c.error = msg + " (--skip-bad skips such lines)";
        return;
      }
      ++c.bad;
      if (c.warnings.size() < kMaxWarnings) c.warnings.push_back(msg);
      continue;
    }
    for (size_t k = 0; k < o.json_keys.size(); ++k) {
      KeyOutput& out = c.out[k];
      int32_t nseq = 0;
      for (std::string_view s : parser.fields()[k].strings) {
        const size_t before = out.tokens.size();
        tok.encode(s, &out.tokens);  // straight into the chunk's tokens: no copy of a huge document's ids
        const size_t n = out.tokens.size() - before;
        if (n == 0) continue;
        MT_CHECK(n <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), c.file, ":", line_no, ": a text of ",
                 n, " tokens is over the format's limit of 2^31 - 1 per sequence; split the document");
        out.seq_lens.push_back(static_cast<int32_t>(n));
        ++nseq;
      }
      if (nseq > 0 && o.append_eod) {
        out.tokens.push_back(tok.eod_id());
        ++out.seq_lens.back();
      }
      out.doc_seqs.push_back(nseq);
    }
    ++c.documents;
  }
}

std::string format_duration(double s) {
  if (s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  return buf;
}

// Shared state of the pipeline's threads. All fields below mu are guarded by it.
struct Pipeline {
  const PreprocessOptions& opt;
  std::mutex mu;
  std::condition_variable cv_space, cv_work, cv_done;
  std::deque<std::unique_ptr<Chunk>> work;
  std::map<int64_t, std::unique_ptr<Chunk>> done;
  int in_flight = 0, limit = 0;
  int64_t chunks_total = -1;  // set by the reader at its end
  bool stop = false;
  std::vector<std::thread> threads;

  explicit Pipeline(const PreprocessOptions& o) : opt(o) {}
  ~Pipeline() {  // joins on every exit path (the writers' destructors then remove temporaries)
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv_space.notify_all();
    cv_work.notify_all();
    for (auto& t : threads) t.join();
  }

  // Reader: waits for room, then queues the chunk. False when stopping.
  bool submit(std::unique_ptr<Chunk> c) {
    std::unique_lock<std::mutex> lk(mu);
    cv_space.wait(lk, [&] { return stop || in_flight < limit; });
    if (stop) return false;
    ++in_flight;
    work.push_back(std::move(c));
    cv_work.notify_one();
    return true;
  }

  void reader() {
    int64_t seq = 0, progress_base = 0;
    auto fresh = [&](const std::string& file, int64_t first_line) {
      auto c = std::make_unique<Chunk>();
      c->seq = seq++;
      c->file = file;
      c->first_line = first_line;
      return c;
    };
    std::unique_ptr<Chunk> c;
    try {
      for (const std::string& path : opt.inputs) {
        LineReader in(path);
        c = fresh(path, 1);
        std::string_view line;
        int64_t bytes_before = 0;
        while (in.next(&line)) {
          if (c->ends.empty() && in.line_is_owned() && line.size() >= opt.chunk_bytes)
            c->text = in.release_line();  // a huge line becomes the chunk's text without a copy
          else
            c->text.append(line);
          c->ends.push_back(c->text.size());
          if (c->text.size() >= opt.chunk_bytes) {
            c->input_bytes = in.bytes_read() - bytes_before;
            bytes_before = in.bytes_read();
            c->progress_pos = progress_base + in.file_offset();
            if (!submit(std::exchange(c, fresh(path, in.line_number() + 1)))) return;
          }
        }
        c->input_bytes = in.bytes_read() - bytes_before;
        const int64_t size = LineReader::file_size(path);
        progress_base += size >= 0 ? size : in.file_offset();
        c->progress_pos = progress_base;
        if (!submit(std::move(c))) return;
      }
    } catch (const std::exception& e) {
      if (!c) c = fresh("", 0);
      c->text.clear();
      c->ends.clear();
      c->error = e.what();
      if (!submit(std::move(c))) return;
    }
    std::lock_guard<std::mutex> lk(mu);
    chunks_total = seq;
    cv_done.notify_all();
  }

  void worker(std::unique_ptr<Tokenizer> tok) {
    for (;;) {
      std::unique_ptr<Chunk> c;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv_work.wait(lk, [&] { return stop || !work.empty(); });
        if (stop) return;
        c = std::move(work.front());
        work.pop_front();
      }
      if (c->error.empty()) {
        try {
          encode_chunk(*c, opt, *tok);
        } catch (const std::exception& e) {
          c->error = c->file + ":" + std::to_string(c->first_line) + "+: " + e.what();
        }
      }
      std::string().swap(c->text);
      std::vector<size_t>().swap(c->ends);
      std::lock_guard<std::mutex> lk(mu);
      const int64_t seq = c->seq;
      done.emplace(seq, std::move(c));
      cv_done.notify_all();
    }
  }
};

}  // namespace

std::string dataset_prefix(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

PreprocessStats preprocess(const PreprocessOptions& o, const std::atomic<bool>* cancel) {
  MT_CHECK(!o.inputs.empty(), "preprocess: no --input file given");
  MT_CHECK(!o.json_keys.empty(), "preprocess: --json-keys is empty");
  for (size_t k = 0; k < o.json_keys.size(); ++k)
    for (size_t m = k + 1; m < o.json_keys.size(); ++m)
      MT_CHECK(o.json_keys[k] != o.json_keys[m], "preprocess: --json-keys names \"", o.json_keys[k], "\" twice");
  MT_CHECK(!o.output_prefix.empty(), "preprocess: --output-prefix is required");
  MT_CHECK(o.workers >= 1, "preprocess: --workers must be at least 1, got ", o.workers);
  for (const std::string& path : o.inputs)
    MT_CHECK(path == "-" || ::access(path.c_str(), R_OK) == 0, path, ": cannot read the input file (--input)");
  auto t0 = Clock::now();
  std::unique_ptr<Tokenizer> tok = make_tokenizer(o.tokenizer);
  PreprocessStats st;
  st.load_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  const DType dtype = token_dtype_for_vocab(tok->vocab_size());
  st.dtype = dtype_name(dtype);
  int64_t total_size = 0;
  for (const std::string& path : o.inputs) {
    const int64_t s = LineReader::file_size(path);
    total_size = (s < 0 || total_size < 0) ? -1 : total_size + s;
  }

  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& key : o.json_keys) {
    st.output_prefixes.push_back(dataset_prefix(o.output_prefix, key));
    writers.push_back(std::make_unique<IndexedDatasetWriter>(st.output_prefixes.back(), dtype));
  }

  Pipeline p(o);  // declared after the writers: its threads are joined before they are destroyed
  p.limit = o.chunks_in_flight > 0 ? o.chunks_in_flight : 2 * o.workers + 2;
  for (int w = 0; w < o.workers; ++w) p.threads.emplace_back(&Pipeline::worker, &p, tok->clone());
  p.threads.emplace_back(&Pipeline::reader, &p);

  const bool tty = ::isatty(STDERR_FILENO);
  auto last_log = Clock::now();
  int64_t progress_pos = 0, warned = 0;
  auto log_progress = [&](bool final) {
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    const double mb = st.input_bytes / 1e6;
    const double frac = total_size > 0 ? static_cast<double>(progress_pos) / total_size : -1;
    const double eta = frac > 0 ? el * (1 - frac) / frac : -1;
    std::fprintf(stderr, "%spreprocess: %lld documents, %.1f MB, %.2f MB/s, %s, ETA %s%s", tty ? "\r\033[K" : "",
                 static_cast<long long>(st.documents), mb, el > 0 ? mb / el : 0.0,
                 frac >= 0 ? (std::to_string(static_cast<int>(frac * 100)) + "%").c_str() : "?%",
                 final ? "0:00:00" : format_duration(eta).c_str(), tty && !final ? "" : "\n");
    std::fflush(stderr);
  };

  for (int64_t next = 0;;) {
    std::unique_ptr<Chunk> c;
    {
      std::unique_lock<std::mutex> lk(p.mu);
      p.cv_done.wait_for(lk, std::chrono::milliseconds(200),
                         [&] { return p.done.count(next) || p.chunks_total == next; });
      auto it = p.done.find(next);
      if (it != p.done.end()) {
        c = std::move(it->second);
        p.done.erase(it);
        --p.in_flight;
        p.cv_space.notify_one();
      } else if (p.chunks_total == next) {
        break;
      }
    }
    MT_CHECK(!(cancel && cancel->load()), "preprocess: interrupted; no output was written under ", o.output_prefix);
    if (o.log_interval > 0 && std::chrono::duration<double>(Clock::now() - last_log).count() >= o.log_interval) {
      log_progress(false);
      last_log = Clock::now();
    }
    if (!c) continue;
    ++next;
    MT_CHECK(c->error.empty(), c->error);
    for (int64_t b = 0; b < c->bad; ++b, ++warned) {
      if (warned < kMaxWarnings && b < static_cast<int64_t>(c->warnings.size()))
        std::fprintf(stderr, "%swarning: %s (skipped)\n", tty ? "\r\033[K" : "", c->warnings[b].c_str());
      else if (warned == kMaxWarnings)
        std::fprintf(stderr, "%swarning: more bad lines are skipped and counted, not listed\n", tty ? "\r\033[K" : "");
    }
    for (size_t k = 0; k < writers.size(); ++k) {
      const KeyOutput& out = c->out[k];
      const int32_t* t = out.tokens.data();
      size_t s = 0;
      for (int32_t nseq : out.doc_seqs) {
        for (int32_t q = 0; q < nseq; ++q, ++s) {
          writers[k]->add_item(t, out.seq_lens[s]);
          t += out.seq_lens[s];
        }
        writers[k]->end_document();
      }
    }
    st.documents += c->documents;
    st.bad_lines += c->bad;
    st.blank_lines += c->blank;
    st.lines += c->documents + c->bad + c->blank;
    st.input_bytes += c->input_bytes;
    progress_pos = c->progress_pos;
  }
  // An input without a single document (empty, blank or all lines skipped as bad) would give a
  // dataset that training cannot read: refused, and nothing is written (the writers remove their
  // temporary files).
  MT_CHECK(st.documents > 0, "preprocess: the input has no documents (", st.lines, " lines: ", st.blank_lines,
           " blank, ", st.bad_lines, " skipped as bad); nothing was written under ", o.output_prefix,
           "; check --input");
  MT_CHECK(writers[0]->num_tokens() > 0, "preprocess: the ", st.documents, " documents of the input have no tokens (",
           "every text is empty); nothing was written under ", o.output_prefix, "; check --input and --json-keys");
  for (auto& w : writers) w->finalize();
  st.sequences = writers[0]->num_sequences();
  st.tokens = writers[0]->num_tokens();
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.log_interval > 0) log_progress(true);
  return st;
}

}  // namespace mt::data
