// Unicode lookups and NFC (UAX #15: canonical decomposition, canonical ordering, canonical
// composition; Hangul syllables computed, not tabled). See unicode.h.
#include "data_tools/unicode.h"

#include <algorithm>
#include <array>
#include <vector>

namespace mt::data {
namespace ut = unicode_tables;

namespace {

constexpr std::array<uint8_t, 128> make_ascii_flags() {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) t[c] = kLetter;
    else if (c >= '0' && c <= '9') t[c] = kNumber;
    else if ((c >= 0x09 && c <= 0x0D) || c == ' ') t[c] = kSpace;
  }
  return t;
}
constexpr std::array<uint8_t, 128> kAsciiFlags = make_ascii_flags();

// Hangul syllable constants (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

const ut::Decomposition* find_decomposition(char32_t c) {
  const ut::Decomposition* end = ut::kDecompositions + ut::kNumDecompositions;
  const ut::Decomposition* it =
      std::lower_bound(ut::kDecompositions, end, c, [](const ut::Decomposition& d, char32_t v) { return d.cp < v; });
  return it != end && it->cp == c ? it : nullptr;
}

void decompose(char32_t c, std::vector<char32_t>* out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out->push_back(kTBase + s % kTCount);
    return;
  }
  const ut::Decomposition* d = find_decomposition(c);
  if (!d) { out->push_back(c); return; }
  decompose(d->first, out);
  if (d->second) decompose(d->second, out);
}

// Primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const ut::Composition* end = ut::kCompositions + ut::kNumCompositions;
  const ut::Composition* it = std::lower_bound(ut::kCompositions, end, std::make_pair(a, b),
                                               [](const ut::Composition& x, const std::pair<char32_t, char32_t>& v) {
                                                 return x.first != v.first ? x.first < v.first : x.second < v.second;
                                               });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

uint8_t char_flags(char32_t c) {
  if (c < 128) return kAsciiFlags[c];
  if (c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
      c == 0x202F || c == 0x205F || c == 0x3000)
    return kSpace;  // White_Space outside ASCII (checked against kWhiteSpace by the tests)
  const ut::CategoryRange* end = ut::kCategoryRanges + ut::kNumCategoryRanges;
  const ut::CategoryRange* it = std::upper_bound(ut::kCategoryRanges, end, c,
                                                 [](char32_t v, const ut::CategoryRange& r) { return v < r.first; });
  if (it == ut::kCategoryRanges) return kOther;
  --it;
  return c <= it->last ? it->cls : uint8_t{kOther};
}

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const ut::CombiningRange* end = ut::kCombiningRanges + ut::kNumCombiningRanges;
  const ut::CombiningRange* it = std::upper_bound(ut::kCombiningRanges, end, c,
                                                  [](char32_t v, const ut::CombiningRange& r) { return v < r.first; });
  if (it == ut::kCombiningRanges) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

void utf8_append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  auto end = p + s.size();
  while (p < end) {
    char32_t cp;
    const int n = utf8_decode(p, end, &cp);
    if (cp == 0xFFFD && n == 1 && *p >= 0x80) return false;
    p += n;
  }
  return true;
}

std::string nfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(s);
  // 1. Full canonical decomposition.
  std::vector<char32_t> d;
  d.reserve(s.size());
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  auto end = p + s.size();
  while (p < end) {
    char32_t cp;
    p += utf8_decode(p, end, &cp);
    decompose(cp, &d);
  }
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // 3. Canonical composition: a character joins the last starter unless blocked.
  std::vector<char32_t> out;
  out.reserve(d.size());
  ptrdiff_t starter = -1;
  int last_ccc = 0;
  for (char32_t c : d) {
    const int ccc = combining_class(c);
    if (starter >= 0) {
      const bool adjacent = static_cast<ptrdiff_t>(out.size()) - 1 == starter;
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        if (char32_t comp = compose(out[starter], c)) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (ccc == 0) starter = static_cast<ptrdiff_t>(out.size());
    last_ccc = ccc;
    out.push_back(c);
  }
  std::string r;
  r.reserve(s.size());
  for (char32_t c : out) utf8_append(c, &r);
  return r;
}

}  // namespace mt::data
