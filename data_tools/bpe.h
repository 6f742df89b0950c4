// The byte-level BPE engine shared by the GPT-2 and Hugging Face tokenizers (one implementation).
//
// Byte level: every byte of the text is first mapped to a printable code point (GPT-2's
// bytes_to_unicode: bytes 33-126, 161-172 and 174-255 map to themselves, the other 68 bytes to
// U+0100.. in order), so that token texts in the vocabulary are printable strings; a token's
// raw bytes are its text mapped back. BPE then starts from one symbol per byte and repeatedly
// merges the adjacent pair of lowest merge rank (leftmost first), as Hugging Face's BPE does;
// for well-formed merge lists this equals GPT-2's "merge every occurrence of the best pair".
//
// BpeModel is immutable and shared between threads; BpeEncoder (one per thread) adds a bounded
// cache of piece -> ids (cleared when it reaches its capacity) and scratch buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mt::data {

char32_t byte_to_unicode(uint8_t b);
int unicode_to_byte(char32_t cp);  // -1 when cp is not one of the 256 byte code points
std::string bytes_to_token_text(std::string_view raw);
// Maps a byte-level token text back to raw bytes; false when a character is not a byte code point.
bool token_text_to_bytes(std::string_view token, std::string* raw);

class BpeModel {
 public:
  // token_texts[id]: the byte-level text of token id ("" for an id without one).
  // merges: (left, right) token texts in rank order; where(i) names merge i for error messages
  // ("vocab.bpe:12"). ignore_merges: a piece that is itself a token is emitted whole (Llama-3).
  BpeModel(const std::vector<std::string>& token_texts, const std::vector<std::pair<std::string, std::string>>& merges,
           bool ignore_merges, const std::string& source, const std::function<std::string(size_t)>& where);

  int64_t num_ids() const { return static_cast<int64_t>(id_bytes_.size()); }
  bool has_id(int32_t id) const { return id >= 0 && id < num_ids() && has_id_[id]; }
  const std::string& bytes_of(int32_t id) const { return id_bytes_[id]; }
  std::optional<int32_t> id_of_bytes(std::string_view raw) const;

  struct Scratch;
  // Appends the ids of one piece of raw bytes (no cache).
  void encode_piece(std::string_view raw, std::vector<int32_t>* out, Scratch* scratch) const;

 private:
  int64_t merge_lookup(int32_t a, int32_t b) const;  // (rank << 32 | merged id), or -1

  std::vector<std::string> id_bytes_;
  std::vector<bool> has_id_;
  std::unordered_map<std::string, int32_t> bytes_to_id_;
  int32_t byte_ids_[256];
  bool ignore_merges_;
  std::vector<uint64_t> merge_keys_;  // open addressing, key (a << 32 | b), empty = ~0
  std::vector<int64_t> merge_vals_;
  uint64_t merge_mask_ = 0;
};

// Per-thread encoder: model + cache + scratch.
class BpeEncoder {
 public:
  explicit BpeEncoder(std::shared_ptr<const BpeModel> model, size_t cache_capacity = 1 << 16);
  ~BpeEncoder();
  BpeEncoder(const BpeEncoder&) = delete;
  BpeEncoder& operator=(const BpeEncoder&) = delete;
  const BpeModel& model() const { return *model_; }
  void encode(std::string_view raw, std::vector<int32_t>* out);
  size_t cache_size() const { return size_; }

 private:
  // Open-addressing table of piece -> ids; keys and ids live in two pools. Cleared, not
  // evicted, when it holds capacity_ entries (a quarter of the slots).
  struct Slot {
    uint64_t hash;  // 0: empty
    uint32_t key_off, ids_off;
    uint16_t key_len, num_ids;
  };
  void clear_cache();
  std::shared_ptr<const BpeModel> model_;
  size_t capacity_, size_ = 0;
  std::vector<Slot> slots_;
  std::string key_pool_;
  std::vector<int32_t> id_pool_;
  std::unique_ptr<BpeModel::Scratch> scratch_;
};

}  // namespace mt::data
