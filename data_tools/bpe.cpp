// Byte-level BPE: the byte <-> code point map, the merge table and the merge loop (see bpe.h).
#include "data_tools/bpe.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/check.h"
#include "data_tools/unicode.h"

namespace mt::data {

namespace {

struct ByteMap {
  std::array<char32_t, 256> to_cp{};
  ByteMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t kEmpty = ~uint64_t{0};

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return byte_map().to_cp[b]; }

int unicode_to_byte(char32_t cp) {
  if (cp < 256) {
    const bool printable = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174);
    return printable ? static_cast<int>(cp) : -1;
  }
  if (cp >= 256 + 68) return -1;
  int k = static_cast<int>(cp - 256);  // the k-th non-printable byte
  for (int b = 0; b < 256; ++b)
    if (byte_map().to_cp[b] >= 256 && k-- == 0) return b;
  return -1;
}

std::string bytes_to_token_text(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char b : raw) utf8_append(byte_map().to_cp[b], &out);
  return out;
}

bool token_text_to_bytes(std::string_view token, std::string* raw) {
  raw->clear();
  auto p = reinterpret_cast<const unsigned char*>(token.data());
  auto end = p + token.size();
  while (p < end) {
    char32_t cp;
    const int n = utf8_decode(p, end, &cp);
    const int b = (cp == 0xFFFD && n == 1 && *p >= 0x80) ? -1 : unicode_to_byte(cp);
    if (b < 0) return false;
    raw->push_back(static_cast<char>(b));
    p += n;
  }
  return true;
}

// ------------------------------------------------------------------------------------ BpeModel

struct BpeModel::Scratch {
  struct Sym { int32_t id, prev, next; };
  std::vector<Sym> syms;
  std::vector<uint64_t> heap;  // (rank << 32 | position), min-heap
};

BpeModel::BpeModel(const std::vector<std::string>& token_texts,
                   const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                   const std::string& source, const std::function<std::string(size_t)>& where)
    : ignore_merges_(ignore_merges) {
  MT_CHECK(token_texts.size() < (size_t{1} << 31), source, ": vocabulary of ", token_texts.size(), " ids is too large");
  id_bytes_.resize(token_texts.size());
  has_id_.assign(token_texts.size(), false);
  bytes_to_id_.reserve(token_texts.size() * 2);
  std::string raw;
  for (size_t id = 0; id < token_texts.size(); ++id) {
    const std::string& text = token_texts[id];
    if (text.empty()) continue;
    has_id_[id] = true;
    if (token_text_to_bytes(text, &raw)) {
      id_bytes_[id] = raw;
      bytes_to_id_.emplace(raw, static_cast<int32_t>(id));
    } else {
      id_bytes_[id] = text;  // not a byte-level text (e.g. a special token): decodes as itself
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    MT_CHECK(it != bytes_to_id_.end(), source, ": not a byte-level BPE vocabulary: no token for byte 0x", std::hex, b,
             " (text \"", bytes_to_token_text(std::string(1, static_cast<char>(b))), "\"); only byte-level BPE is supported");
    byte_ids_[b] = it->second;
  }
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  merge_keys_.assign(cap, kEmpty);
  merge_vals_.assign(cap, -1);
  merge_mask_ = cap - 1;
  std::string lb, rb;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [l, r] = merges[rank];
    auto id_of_text = [&](const std::string& t, std::string* bytes) -> int32_t {
      if (!token_text_to_bytes(t, bytes)) return -1;
      auto it = bytes_to_id_.find(*bytes);
      return it == bytes_to_id_.end() ? -1 : it->second;
    };
    const int32_t a = id_of_text(l, &lb), b = id_of_text(r, &rb);
    MT_CHECK(a >= 0, where(rank), ": merge \"", l, " ", r, "\": \"", l, "\" is not a token of the vocabulary");
    MT_CHECK(b >= 0, where(rank), ": merge \"", l, " ", r, "\": \"", r, "\" is not a token of the vocabulary");
    auto m = bytes_to_id_.find(lb + rb);
    MT_CHECK(m != bytes_to_id_.end(), where(rank), ": merge \"", l, " ", r, "\": the merged token \"", l, r,
             "\" is not in the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
    for (uint64_t h = mix(key) & merge_mask_;; h = (h + 1) & merge_mask_) {
      if (merge_keys_[h] == key) break;  // duplicate merge: the first (lowest rank) wins
      if (merge_keys_[h] == kEmpty) {
        merge_keys_[h] = key;
        merge_vals_[h] = (static_cast<int64_t>(rank) << 32) | m->second;
        break;
      }
    }
  }
}

std::optional<int32_t> BpeModel::id_of_bytes(std::string_view raw) const {
  auto it = bytes_to_id_.find(std::string(raw));
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

inline int64_t BpeModel::merge_lookup(int32_t a, int32_t b) const {
  const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  for (uint64_t h = mix(key) & merge_mask_;; h = (h + 1) & merge_mask_) {
    if (merge_keys_[h] == key) return merge_vals_[h];
    if (merge_keys_[h] == kEmpty) return -1;
  }
}

void BpeModel::encode_piece(std::string_view raw, std::vector<int32_t>* out, Scratch* s) const {
  const size_t n = raw.size();
  if (n == 0) return;
  if (n == 1) { out->push_back(byte_ids_[static_cast<unsigned char>(raw[0])]); return; }
  if (ignore_merges_) {
    if (auto id = id_of_bytes(raw)) { out->push_back(*id); return; }
  }
  auto& syms = s->syms;
  auto& heap = s->heap;
  syms.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i)
    syms[i] = {byte_ids_[static_cast<unsigned char>(raw[i])], static_cast<int32_t>(i) - 1,
               i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  auto push = [&](int32_t pos) {
    const int32_t nx = syms[pos].next;
    if (nx < 0) return;
    const int64_t v = merge_lookup(syms[pos].id, syms[nx].id);
    if (v < 0) return;
    heap.push_back((static_cast<uint64_t>(v) & 0xFFFFFFFF00000000ULL) | static_cast<uint32_t>(pos));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const int32_t pos = static_cast<int32_t>(top & 0xFFFFFFFF);
    const int32_t nx = syms[pos].next;
    if (syms[pos].id < 0 || nx < 0) continue;
    const int64_t v = merge_lookup(syms[pos].id, syms[nx].id);
    if (v < 0 || (static_cast<uint64_t>(v) >> 32) != (top >> 32)) continue;  // stale entry
    syms[pos].id = static_cast<int32_t>(v & 0xFFFFFFFF);
    syms[nx].id = -1;
    syms[pos].next = syms[nx].next;
    if (syms[pos].next >= 0) syms[syms[pos].next].prev = pos;
    if (syms[pos].prev >= 0) push(syms[pos].prev);
    push(pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
}

// ---------------------------------------------------------------------------------- BpeEncoder

BpeEncoder::BpeEncoder(std::shared_ptr<const BpeModel> model, size_t cache_capacity)
    : model_(std::move(model)), capacity_(cache_capacity), scratch_(std::make_unique<BpeModel::Scratch>()) {
  size_t n = 16;
  while (n < 4 * capacity_) n <<= 1;
  slots_.assign(capacity_ ? n : 0, Slot{0, 0, 0, 0, 0});
}

BpeEncoder::~BpeEncoder() = default;

void BpeEncoder::clear_cache() {
  std::fill(slots_.begin(), slots_.end(), Slot{0, 0, 0, 0, 0});
  key_pool_.clear();
  id_pool_.clear();
  size_ = 0;
}

void BpeEncoder::encode(std::string_view raw, std::vector<int32_t>* out) {
  constexpr size_t kMaxCachedPiece = 64;
  if (raw.size() <= 1 || raw.size() > kMaxCachedPiece || capacity_ == 0) {
    model_->encode_piece(raw, out, scratch_.get());
    return;
  }
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed
  for (unsigned char c : raw) h = (h ^ c) * 0x100000001b3ULL;
  h = mix(h) | 1;  // never 0 (the empty mark)
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  for (; slots_[i].hash != 0; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == h && s.key_len == raw.size() && std::memcmp(key_pool_.data() + s.key_off, raw.data(), raw.size()) == 0) {
      out->insert(out->end(), id_pool_.begin() + s.ids_off, id_pool_.begin() + s.ids_off + s.num_ids);
      return;
    }
  }
  const size_t before = out->size();
  model_->encode_piece(raw, out, scratch_.get());
  if (size_ >= capacity_ || id_pool_.size() + raw.size() > UINT32_MAX / 2) {  // bounded: start over
    clear_cache();
    for (i = h & mask; slots_[i].hash != 0; i = (i + 1) & mask) {}
  }
  slots_[i] = Slot{h, static_cast<uint32_t>(key_pool_.size()), static_cast<uint32_t>(id_pool_.size()),
                   static_cast<uint16_t>(raw.size()), static_cast<uint16_t>(out->size() - before)};
  key_pool_.append(raw);
  id_pool_.insert(id_pool_.end(), out->begin() + before, out->end());
  ++size_;
}

}  // namespace mt::data
