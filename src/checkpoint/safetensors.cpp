#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "checkpoint/ckpt_util.h"
#include "core/check.h"

namespace mt::st {

namespace fs = std::filesystem;

namespace {
// The format's own limit on the header (safetensors' MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeader = 100ull * 1000 * 1000;

}  // namespace

bool dtype_from_st(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::F32;
  else if (s == "F16") *out = DType::F16;
  else if (s == "BF16") *out = DType::BF16;
  else return false;
  return true;
}

const char* dtype_to_st(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: break;
  }
  MT_CHECK(false, "safetensors: megatrain writes F32, F16 or BF16 tensors, not ", dtype_name(t));
  return "";
}

File::File(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, path, ": cannot open: ", ckpt::detail::errno_text(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const int e = errno;
    ::close(fd);
    MT_CHECK(false, path, ": cannot stat: ", ckpt::detail::errno_text(e));
  }
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  if (size < 8) {
    ::close(fd);
    MT_CHECK(false, path, ": not a safetensors file: ", size, " bytes, shorter than the 8-byte header length");
  }
  map_len_ = size;
  map_ = ::mmap(nullptr, map_len_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    MT_CHECK(false, path, ": cannot map: ", ckpt::detail::errno_text(e));
  }
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  MT_CHECK(n <= kMaxHeader, path, ": header length ", n, " exceeds the format's limit of ", kMaxHeader,
           " bytes (not a safetensors file, or a corrupt one)");
  MT_CHECK(8 + n <= size, path, ": truncated: the header length says ", n, " bytes but the file has only ", size - 8,
           " after it");
  MT_CHECK(n >= 2 && bytes[8] == '{', path, ": the header does not start with '{' (not a safetensors file)");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(bytes + 8, bytes + 8 + n);  // trailing spaces are allowed by JSON
  } catch (const std::exception& ex) {
    MT_CHECK(false, path, ": the header is not valid JSON: ", ex.what());
  }
  MT_CHECK(h.is_object(), path, ": the header is not a JSON object");
  data_ = bytes + 8 + n;
  const uint64_t data_size = size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      MT_CHECK(v.is_object(), path, ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        MT_CHECK(m.value().is_string(), path, ": __metadata__ value '", m.key(), "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    MT_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets") &&
                 v["dtype"].is_string() && v["shape"].is_array() && v["data_offsets"].is_array() &&
                 v["data_offsets"].size() == 2,
             path, ": tensor '", name, "': the header entry needs \"dtype\" (string), \"shape\" (array) and "
             "\"data_offsets\" ([begin, end])");
    TensorInfo t;
    t.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    MT_CHECK(dtype_from_st(dt, &t.dtype), path, ": tensor '", name, "' has dtype ", dt,
             ", which megatrain does not read (F32, F16, BF16): convert the model to one of them first");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      MT_CHECK(d.is_number_unsigned(), path, ": tensor '", name, "': shape entries must be non-negative integers");
      const uint64_t x = d.get<uint64_t>();
      MT_CHECK(x < (1ull << 40) && numel < (1ull << 50) / std::max<uint64_t>(x, 1), path, ": tensor '", name,
               "': shape ", v["shape"].dump(), " is too large");
      numel *= x;
      t.shape.push_back(static_cast<int64_t>(x));
    }
    for (const auto& o : v["data_offsets"])
      MT_CHECK(o.is_number_unsigned(), path, ": tensor '", name, "': data_offsets must be non-negative integers");
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    MT_CHECK(t.begin <= t.end, path, ": tensor '", name, "': data_offsets [", t.begin, ", ", t.end, "] end before they begin");
    MT_CHECK(t.end - t.begin == numel * dtype_size(t.dtype), path, ": tensor '", name, "': ", dt, " shape ",
             shape_str(t.shape), " needs ", numel * dtype_size(t.dtype), " bytes but data_offsets [", t.begin, ", ",
             t.end, "] hold ", t.end - t.begin);
    MT_CHECK(t.end <= data_size, path, ": tensor '", name, "': data_offsets [", t.begin, ", ", t.end,
             "] run past the data section (", data_size, " bytes): the file is truncated or corrupt");
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The offsets must tile the data section: each tensor starts where the previous one ended.
  uint64_t pos = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    MT_CHECK(t.begin >= pos, path, ": tensor '", t.name, "' (bytes [", t.begin, ", ", t.end, "]) overlaps tensor '",
             tensors_[i - 1].name, "' (bytes [", tensors_[i - 1].begin, ", ", tensors_[i - 1].end, "])");
    MT_CHECK(t.begin == pos, path, ": a gap of ", t.begin - pos, " bytes before tensor '", t.name,
             "' (data_offsets must be contiguous)");
    pos = t.end;
    by_name_[t.name] = i;
  }
  MT_CHECK(pos == data_size, path, ": ", data_size - pos, " bytes after the last tensor are not part of any tensor");
}

File::~File() {
  if (map_ != nullptr) ::munmap(map_, map_len_);
}

const TensorInfo* File::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Archive::Archive(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    describe_ = index;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(ckpt::detail::read_text_file(index));
    } catch (const nlohmann::json::exception& ex) {
      MT_CHECK(false, index, ": not valid JSON: ", ex.what());
    }
    MT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index,
             ": needs a \"weight_map\" object (tensor name -> shard file)");
    std::map<std::string, const File*> by_file;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      MT_CHECK(it.value().is_string(), index, ": weight_map['", it.key(), "'] is not a file name");
      const std::string f = it.value().get<std::string>();
      MT_CHECK(f.find('/') == std::string::npos && !f.empty() && f != "." && f != "..", index, ": weight_map['",
               it.key(), "'] = '", f, "' is not a file name in the same folder");
      if (!by_file.count(f)) {
        files_.push_back(std::make_unique<File>(dir + "/" + f));
        by_file[f] = files_.back().get();
      }
      const File* file = by_file[f];
      const TensorInfo* t = file->find(it.key());
      MT_CHECK(t != nullptr, index, ": names tensor '", it.key(), "' in ", f, ", which does not hold it");
      entries_[it.key()] = Entry{file, t};
    }
    for (const auto& file : files_)
      for (const TensorInfo& t : file->tensors()) {
        auto e = entries_.find(t.name);
        MT_CHECK(e != entries_.end() && e->second.file == file.get(), file->path(), ": holds tensor '", t.name,
                 "' that ", index, " does not place in this file");
      }
    return;
  }
  MT_CHECK(fs::exists(single), dir, ": no model.safetensors and no model.safetensors.index.json (megatrain reads "
                               "safetensors weights only; save the model with safe_serialization=True)");
  describe_ = single;
  files_.push_back(std::make_unique<File>(single));
  for (const TensorInfo& t : files_[0]->tensors()) entries_[t.name] = Entry{files_[0].get(), &t};
}

const Archive::Entry* Archive::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t pos = 0;
  for (const WriteTensor& t : tensors) {
    const uint64_t n = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    h[t.name] = {{"dtype", dtype_to_st(t.dtype)}, {"shape", t.shape}, {"data_offsets", {pos, pos + n}}};
    pos += n;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  std::vector<ckpt::detail::Chunk> chunks = {{len, 8}, {header.data(), header.size()}};
  for (const WriteTensor& t : tensors)
    chunks.push_back({t.data, static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype)});
  ckpt::detail::write_file_durable(path, chunks);
}

std::vector<std::string> write_model(const std::string& dir, const std::vector<WriteTensor>& tensors,
                                     uint64_t max_shard_bytes) {
  std::vector<std::vector<WriteTensor>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const WriteTensor& t : tensors) {
    const uint64_t n = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (cur > 0 && cur + n > max_shard_bytes) shards.emplace_back(), cur = 0;
    shards.back().push_back(t);
    cur += n;
    total += n;
  }
  std::vector<std::string> names;
  if (shards.size() == 1) {
    write_file(dir + "/model.safetensors", tensors, {{"format", "pt"}});
    return {"model.safetensors"};
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  char buf[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_file(dir + "/" + buf, shards[i], {{"format", "pt"}});
    names.push_back(buf);
    for (const WriteTensor& t : shards[i]) index["weight_map"][t.name] = buf;
  }
  ckpt::detail::write_file_durable(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  names.push_back("model.safetensors.index.json");
  return names;
}

uint64_t parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  MT_CHECK(i > 0 && i <= 18, "--max-shard-size '", s, "': give a size such as 5GB, 500MB or 1000000");
  const uint64_t v = std::stoull(s.substr(0, i));
  const std::string unit = s.substr(i);
  uint64_t mul = 0;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KB") mul = 1000;
  else if (unit == "MB") mul = 1000 * 1000;
  else if (unit == "GB") mul = 1000ull * 1000 * 1000;
  else if (unit == "KiB") mul = 1024;
  else if (unit == "MiB") mul = 1024 * 1024;
  else if (unit == "GiB") mul = 1024ull * 1024 * 1024;
  MT_CHECK(mul != 0 && v > 0, "--max-shard-size '", s, "': give a positive size such as 5GB, 500MB, 2GiB or 1000000");
  return v * mul;
}

}  // namespace mt::st
