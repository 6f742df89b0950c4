// Megatron-Core indexed dataset (.idx/.bin): memory-mapped reader and atomic writer.
// Layout: see indexed_dataset.h. Everything is little-endian; we only build for little-endian
// hosts, so the mapped arrays are read in place (by memcpy: they are not aligned).
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/check.h"

static_assert(std::endian::native == std::endian::little, "megatrain's data format code assumes a little-endian host");

namespace mt::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, seq count, doc count

std::string errno_text() { return std::strerror(errno); }

// Megatron's dtype codes -> our DType (int8/int16 tokens are not supported: false).
bool dtype_from_code(uint8_t code, DType* out) {
  switch (code) {
    case 1: *out = DType::U8; return true;
    case 4: *out = DType::I32; return true;
    case 5: *out = DType::I64; return true;
    case 6: *out = DType::F64; return true;
    case 7: *out = DType::F32; return true;
    case 8: *out = DType::U16; return true;
    default: return false;
  }
}

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Value of element k of a raw little-endian array of dtype t, as int64 (floats truncated).
int64_t token_at(const unsigned char* p, DType t, int64_t k) {
  switch (t) {
    case DType::U8: return p[k];
    case DType::U16: return load<uint16_t>(p + 2 * k);
    case DType::I32: return load<int32_t>(p + 4 * k);
    case DType::I64: return load<int64_t>(p + 8 * k);
    case DType::F32: return static_cast<int64_t>(load<float>(p + 4 * k));
    case DType::F64: return static_cast<int64_t>(load<double>(p + 8 * k));
    default: break;
  }
  MT_INTERNAL_ASSERT(false, "token dtype ", dtype_name(t));
  return 0;
}

}  // namespace

DType token_dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? DType::U16 : DType::I32; }

uint8_t indexed_dtype_code(DType t) {
  switch (t) {
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 5;
    case DType::F64: return 6;
    case DType::F32: return 7;
    case DType::U16: return 8;
    default: break;
  }
  MT_CHECK(false, "dtype ", dtype_name(t), " has no code in Megatron's indexed dataset format (use uint16 or int32 tokens)");
  return 0;
}

// ------------------------------------------------------------------------------------ reader

// A read-only mapping of a whole file (size 0: no mapping, data() == nullptr).
struct IndexedDataset::Mapping {
  void* addr = nullptr;
  int64_t size = 0;
  Mapping(const std::string& path, const char* what_for) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MT_CHECK(fd >= 0, "data file '", path, "': cannot open (", errno_text(), "); ", what_for);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      std::string e = errno_text();
      ::close(fd);
      MT_CHECK(false, "data file '", path, "': cannot stat (", e, ")");
    }
    size = st.st_size;
    if (size > 0) {
      addr = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
      if (addr == MAP_FAILED) {
        std::string e = errno_text();
        ::close(fd);
        MT_CHECK(false, "data file '", path, "': cannot mmap ", size, " bytes (", e, ")");
      }
    }
    ::close(fd);  // the mapping stays valid
  }
  ~Mapping() {
    if (addr) ::munmap(addr, static_cast<size_t>(size));
  }
  const unsigned char* data() const { return static_cast<const unsigned char*>(addr); }
};

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  const char* fix = "run megatrain-data preprocess or fix the prefix";
  idx_map_ = std::make_unique<Mapping>(idx, fix);
  const unsigned char* p = idx_map_->data();
  const int64_t idx_size = idx_map_->size;
  MT_CHECK(idx_size >= kHeaderBytes, "data file '", idx, "': truncated: ", idx_size, " bytes, shorter than the ",
           kHeaderBytes, "-byte header");
  MT_CHECK(std::memcmp(p, kMagic, 9) == 0, "data file '", idx,
           "': bad magic (not a Megatron indexed dataset index, expected \"MMIDIDX\")");
  const uint64_t version = load<uint64_t>(p + 9);
  MT_CHECK(version == kVersion, "data file '", idx, "': unsupported version ", version, " (megatrain reads version 1)");
  const uint8_t code = p[17];
  MT_CHECK(dtype_from_code(code, &dtype_), "data file '", idx, "': ",
           (code == 2 || code == 3) ? "unsupported" : "unknown", " dtype code ", int(code),
           " (megatrain reads 1 uint8, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)");
  const uint64_t seq_count = load<uint64_t>(p + 18), doc_count = load<uint64_t>(p + 26);
  const uint64_t max_count = static_cast<uint64_t>(idx_size) / 8;
  MT_CHECK(seq_count <= max_count && doc_count <= max_count, "data file '", idx, "': header counts (", seq_count,
           " sequences, ", doc_count, " document indices) do not fit its ", idx_size, " bytes (corrupt or truncated)");
  const int64_t S = static_cast<int64_t>(seq_count), D = static_cast<int64_t>(doc_count);
  const int64_t expected = kHeaderBytes + 12 * S + 8 * D;
  MT_CHECK(idx_size >= expected, "data file '", idx, "': truncated: ", idx_size, " bytes, but ", S, " sequences and ",
           D, " document indices need ", expected);
  MT_CHECK(idx_size != expected + S || S == 0, "data file '", idx,
           "': has per-sequence modes (a multimodal index), which megatrain does not read");
  MT_CHECK(idx_size == expected, "data file '", idx, "': ", idx_size - expected,
           " unexpected trailing bytes after the index arrays (", S, " sequences, ", D, " document indices)");
  num_sequences_ = S;
  lengths_ = p + kHeaderBytes;
  pointers_ = lengths_ + 4 * S;
  const unsigned char* docs = pointers_ + 8 * S;

  // Lengths non-negative, pointers exactly the running sum of lengths * dtype size.
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype_));
  int64_t offset = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int32_t len = sequence_length(i);
    MT_CHECK(len >= 0, "data file '", idx, "': sequence ", i, " has negative length ", len, " (corrupt index)");
    const int64_t ptr = sequence_pointer(i);
    MT_CHECK(ptr == offset, "data file '", idx, "': sequence ", i, " starts at byte ", ptr, " of '", bin,
             "', expected ", offset, " (the running sum of the lengths): corrupt index");
    offset += len * esize;
  }
  num_tokens_ = offset / esize;

  MT_CHECK(D >= 1, "data file '", idx, "': no document indices (there must be at least the leading 0)");
  document_indices_.resize(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    const int64_t v = load<int64_t>(docs + 8 * d);
    MT_CHECK(d > 0 || v == 0, "data file '", idx, "': document indices start at ", v, ", not 0 (corrupt index)");
    MT_CHECK(d == 0 || v >= document_indices_[d - 1], "data file '", idx, "': document index ", d, " (", v,
             ") is smaller than the previous one (", document_indices_[d - 1], "): corrupt index");
    document_indices_[d] = v;
  }
  MT_CHECK(document_indices_.back() == S, "data file '", idx, "': the last document index is ",
           document_indices_.back(), " but there are ", S, " sequences (corrupt index)");

  bin_map_ = std::make_unique<Mapping>(bin, "the .idx has no .bin beside it: run megatrain-data preprocess again");
  MT_CHECK(bin_map_->size >= offset, "data file '", bin, "': truncated: ", bin_map_->size, " bytes, but '", idx,
           "' describes ", offset, " (", num_tokens_, " ", dtype_name(dtype_), " tokens)");
  MT_CHECK(bin_map_->size == offset, "data file '", bin, "': ", bin_map_->size, " bytes, but '", idx, "' describes ",
           offset, " (", num_tokens_, " ", dtype_name(dtype_), " tokens): the .bin does not belong to this .idx");
}

IndexedDataset::~IndexedDataset() = default;

const unsigned char* IndexedDataset::bin_data() const { return bin_map_->data(); }

void IndexedDataset::read(int64_t i, int64_t offset, int64_t count, int32_t* out) const {
  MT_INTERNAL_ASSERT(i >= 0 && i < num_sequences_ && offset >= 0 && count >= 0 && offset + count <= sequence_length(i),
                     "read of sequence ", i, " tokens [", offset, ", ", offset + count, ") of '", prefix_, "'");
  if (count == 0) return;
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype_));
  const unsigned char* p = bin_data() + sequence_pointer(i) + offset * esize;
  switch (dtype_) {
    case DType::U16:
      for (int64_t k = 0; k < count; ++k) out[k] = load<uint16_t>(p + 2 * k);
      break;
    case DType::I32:
      std::memcpy(out, p, static_cast<size_t>(count) * 4);
      break;
    default:
      for (int64_t k = 0; k < count; ++k) out[k] = static_cast<int32_t>(token_at(p, dtype_, k));
  }
}

std::pair<int64_t, int64_t> IndexedDataset::token_range(int64_t max_tokens) const {
  const int64_t n = max_tokens < 0 ? num_tokens_ : std::min(max_tokens, num_tokens_);
  if (n == 0) return {0, -1};
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  const unsigned char* p = bin_data();
  if (dtype_ == DType::U16) {  // the common case, kept simple enough to vectorize
    uint16_t l = 0xffff, h = 0;
    for (int64_t k = 0; k < n; ++k) {
      const uint16_t v = load<uint16_t>(p + 2 * k);
      l = v < l ? v : l;
      h = v > h ? v : h;
    }
    return {l, h};
  }
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = token_at(p, dtype_, k);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return {lo, hi};
}

// ------------------------------------------------------------------------------------ writer

struct IndexedDatasetWriter::Impl {
  std::string bin_tmp, idx_tmp;
  std::FILE* bin = nullptr;
  std::vector<int32_t> lengths;
  std::vector<int64_t> doc_indices{0};
  std::vector<unsigned char> buf;  // conversion buffer
  int64_t tokens = 0;
  bool finalized = false;

  void write(const void* data, size_t n, const std::string& path, std::FILE* f) {
    if (n > 0 && std::fwrite(data, 1, n, f) != n)
      MT_CHECK(false, "data file '", path, "': write failed (", errno_text(), ")");
  }
  void close_document() {
    if (static_cast<int64_t>(lengths.size()) > doc_indices.back()) doc_indices.push_back(static_cast<int64_t>(lengths.size()));
  }
};

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, DType token_dtype)
    : prefix_(prefix), dtype_(token_dtype), impl_(std::make_unique<Impl>()) {
  (void)indexed_dtype_code(token_dtype);  // rejects types the format lacks
  MT_CHECK(token_dtype != DType::F32 && token_dtype != DType::F64, "IndexedDatasetWriter: token dtype ",
           dtype_name(token_dtype), " is not an integer type (use uint16 or int32)");
  impl_->bin_tmp = prefix + ".bin.tmp";
  impl_->idx_tmp = prefix + ".idx.tmp";
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);  // a failure shows in fopen below
  impl_->bin = std::fopen(impl_->bin_tmp.c_str(), "wb");
  MT_CHECK(impl_->bin, "data file '", impl_->bin_tmp, "': cannot create (", errno_text(), ")");
  std::setvbuf(impl_->bin, nullptr, _IOFBF, 1 << 20);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (impl_->bin) std::fclose(impl_->bin);
  if (!impl_->finalized) {
    std::remove(impl_->bin_tmp.c_str());
    std::remove(impl_->idx_tmp.c_str());
  }
}

void IndexedDatasetWriter::add_item(const int32_t* tokens, int64_t count) {
  Impl& m = *impl_;
  MT_INTERNAL_ASSERT(!m.finalized, "add_item after finalize");
  MT_CHECK(count >= 0 && count <= std::numeric_limits<int32_t>::max(), "data file '", m.bin_tmp, "': sequence of ",
           count, " tokens does not fit the format's int32 length");
  const size_t esize = dtype_size(dtype_);
  const int64_t lo = dtype_ == DType::U16 ? 0 : dtype_ == DType::U8 ? 0 : std::numeric_limits<int32_t>::min();
  const int64_t hi = dtype_ == DType::U16 ? 65535 : dtype_ == DType::U8 ? 255 : std::numeric_limits<int32_t>::max();
  m.buf.resize(static_cast<size_t>(count) * esize);
  for (int64_t k = 0; k < count; ++k) {
    const int32_t t = tokens[k];
    MT_CHECK(t >= lo && t <= hi, "data file '", m.bin_tmp, "': token ", t, " does not fit the dataset's ",
             dtype_name(dtype_), " type (choose the token dtype from the vocabulary size)");
    unsigned char* dst = m.buf.data() + k * esize;
    switch (dtype_) {
      case DType::U8: *dst = static_cast<unsigned char>(t); break;
      case DType::U16: { const uint16_t v = static_cast<uint16_t>(t); std::memcpy(dst, &v, 2); break; }
      case DType::I32: std::memcpy(dst, &t, 4); break;
      case DType::I64: { const int64_t v = t; std::memcpy(dst, &v, 8); break; }
      default: MT_INTERNAL_ASSERT(false, "writer dtype");
    }
  }
  m.write(m.buf.data(), m.buf.size(), m.bin_tmp, m.bin);
  m.lengths.push_back(static_cast<int32_t>(count));
  m.tokens += count;
}

void IndexedDatasetWriter::end_document() {
  MT_INTERNAL_ASSERT(!impl_->finalized, "end_document after finalize");
  impl_->doc_indices.push_back(static_cast<int64_t>(impl_->lengths.size()));
}

void IndexedDatasetWriter::add_index(const std::string& other_prefix) {
  Impl& m = *impl_;
  MT_INTERNAL_ASSERT(!m.finalized, "add_index after finalize");
  IndexedDataset other(other_prefix);
  MT_CHECK(other.dtype() == dtype_, "data file '", other_prefix, ".idx': token dtype ", dtype_name(other.dtype()),
           " differs from the ", dtype_name(dtype_), " of the dataset being written ('", prefix_,
           "'): datasets of one vocabulary only");
  m.close_document();
  const int64_t offset = static_cast<int64_t>(m.lengths.size());
  for (int64_t i = 0; i < other.num_sequences(); ++i) m.lengths.push_back(other.sequence_length(i));
  const auto& docs = other.document_indices();
  for (size_t d = 1; d < docs.size(); ++d) m.doc_indices.push_back(offset + docs[d]);
  m.write(other.bin_data(), static_cast<size_t>(other.bin_size()), m.bin_tmp, m.bin);
  m.tokens += other.num_tokens();
}

void IndexedDatasetWriter::finalize() {
  Impl& m = *impl_;
  MT_INTERNAL_ASSERT(!m.finalized, "finalize twice");
  m.close_document();
  const bool bin_ok = std::fflush(m.bin) == 0 && std::fclose(m.bin) == 0;
  m.bin = nullptr;
  MT_CHECK(bin_ok, "data file '", m.bin_tmp, "': write failed (", errno_text(), ")");

  std::FILE* f = std::fopen(m.idx_tmp.c_str(), "wb");
  MT_CHECK(f, "data file '", m.idx_tmp, "': cannot create (", errno_text(), ")");
  const uint64_t S = m.lengths.size(), D = m.doc_indices.size();
  const uint8_t code = indexed_dtype_code(dtype_);
  std::vector<int64_t> pointers(S);
  int64_t ptr = 0;
  for (size_t i = 0; i < S; ++i) {
    pointers[i] = ptr;
    ptr += static_cast<int64_t>(m.lengths[i]) * static_cast<int64_t>(dtype_size(dtype_));
  }
  try {
    m.write(kMagic, 9, m.idx_tmp, f);
    m.write(&kVersion, 8, m.idx_tmp, f);
    m.write(&code, 1, m.idx_tmp, f);
    m.write(&S, 8, m.idx_tmp, f);
    m.write(&D, 8, m.idx_tmp, f);
    m.write(m.lengths.data(), 4 * S, m.idx_tmp, f);
    m.write(pointers.data(), 8 * S, m.idx_tmp, f);
    m.write(m.doc_indices.data(), 8 * D, m.idx_tmp, f);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  MT_CHECK(std::fclose(f) == 0, "data file '", m.idx_tmp, "': write failed (", errno_text(), ")");
  // .bin first: a final-named .idx always has its complete .bin beside it.
  const std::string bin = prefix_ + ".bin", idx = prefix_ + ".idx";
  MT_CHECK(std::rename(m.bin_tmp.c_str(), bin.c_str()) == 0, "data file '", bin, "': cannot rename from '", m.bin_tmp,
           "' (", errno_text(), ")");
  MT_CHECK(std::rename(m.idx_tmp.c_str(), idx.c_str()) == 0, "data file '", idx, "': cannot rename from '", m.idx_tmp,
           "' (", errno_text(), ")");
  m.finalized = true;
}

int64_t IndexedDatasetWriter::num_sequences() const { return static_cast<int64_t>(impl_->lengths.size()); }
int64_t IndexedDatasetWriter::num_documents() const { return static_cast<int64_t>(impl_->doc_indices.size()) - 1; }
int64_t IndexedDatasetWriter::num_tokens() const { return impl_->tokens; }

}  // namespace mt::data
