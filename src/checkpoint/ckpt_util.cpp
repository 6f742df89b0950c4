// Checkpoint internals: boxes, durable writes, read-only mappings, directory names (ckpt_util.h).
#include "checkpoint/ckpt_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>
#include <vector>

namespace mt::ckpt::detail {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- boxes

int64_t box_volume(const Box& b) { return shape_numel(b.len); }

std::string box_str(const Box& b) { return str_cat("offset ", shape_str(b.off), " shape ", shape_str(b.len)); }

bool box_intersect(const Box& a, const Box& b, Box* out) {
  MT_INTERNAL_ASSERT(a.off.size() == b.off.size() && a.len.size() == a.off.size() && b.len.size() == b.off.size(),
                     "box rank mismatch: ", box_str(a), " vs ", box_str(b));
  Box r;
  r.off.resize(a.off.size());
  r.len.resize(a.off.size());
  bool nonempty = true;
  for (size_t d = 0; d < a.off.size(); ++d) {
    int64_t lo = std::max(a.off[d], b.off[d]);
    int64_t hi = std::min(a.off[d] + a.len[d], b.off[d] + b.len[d]);
    r.off[d] = lo;
    r.len[d] = std::max<int64_t>(hi - lo, 0);
    if (hi <= lo) nonempty = false;
  }
  if (out) *out = std::move(r);
  return nonempty;
}

std::string tiling_problem(const Box& domain, const std::vector<Box>& boxes) {
  const size_t rank = domain.off.size();
  int64_t covered = 0;
  for (const Box& b : boxes) {
    if (b.off.size() != rank || b.len.size() != rank) {
      return str_cat("shard ", box_str(b), " has rank ", b.off.size(), ", the tensor has rank ", rank);
    }
    for (size_t d = 0; d < rank; ++d) {
      if (b.len[d] < 0 || b.off[d] < domain.off[d] || b.off[d] + b.len[d] > domain.off[d] + domain.len[d]) {
        return str_cat("shard ", box_str(b), " lies outside ", box_str(domain));
      }
    }
    covered += box_volume(b);
  }
  // Overlaps: sweep along dimension 0 (only boxes whose first-dimension ranges meet can overlap).
  std::vector<size_t> order(boxes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (rank > 0) {
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return boxes[a].off[0] < boxes[b].off[0]; });
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const Box& a = boxes[order[i]];
    for (size_t j = i + 1; j < order.size(); ++j) {
      const Box& b = boxes[order[j]];
      if (rank > 0 && b.off[0] >= a.off[0] + a.len[0]) break;
      if (box_intersect(a, b, nullptr)) return str_cat("shards ", box_str(a), " and ", box_str(b), " overlap");
    }
  }
  if (covered != box_volume(domain)) {
    return str_cat("the shards cover ", covered, " of the ", box_volume(domain), " elements of ", box_str(domain),
                   " (a gap)");
  }
  return "";
}

void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& region, size_t elem) {
  const int rank = static_cast<int>(region.off.size());
  for (int d = 0; d < rank; ++d) {
    MT_INTERNAL_ASSERT(region.off[d] >= src_box.off[d] && region.off[d] + region.len[d] <= src_box.off[d] + src_box.len[d] &&
                           region.off[d] >= dst_box.off[d] && region.off[d] + region.len[d] <= dst_box.off[d] + dst_box.len[d],
                       "copy of ", box_str(region), " from ", box_str(src_box), " into ", box_str(dst_box));
    if (region.len[d] == 0) return;
  }
  const char* s = static_cast<const char*>(src);
  char* t = static_cast<char*>(dst);
  if (rank == 0) {
    std::memcpy(t, s, elem);
    return;
  }
  // Row-major strides in bytes.
  std::vector<int64_t> ss(rank), ds(rank);
  ss[rank - 1] = ds[rank - 1] = static_cast<int64_t>(elem);
  for (int d = rank - 2; d >= 0; --d) {
    ss[d] = ss[d + 1] * src_box.len[d + 1];
    ds[d] = ds[d + 1] * dst_box.len[d + 1];
  }
  // One contiguous run: the last dimension, merged with the ones before it while they are whole in
  // all three boxes.
  int last = rank - 1;
  int64_t run = region.len[last] * static_cast<int64_t>(elem);
  while (last > 0 && region.len[last] == src_box.len[last] && region.len[last] == dst_box.len[last]) {
    --last;
    run *= region.len[last];
  }
  int64_t s0 = 0, d0 = 0;
  for (int d = 0; d < rank; ++d) {
    s0 += (region.off[d] - src_box.off[d]) * ss[d];
    d0 += (region.off[d] - dst_box.off[d]) * ds[d];
  }
  // Odometer over the dimensions before `last`.
  std::vector<int64_t> idx(last, 0);
  int64_t so = s0, dof = d0;
  while (true) {
    std::memcpy(t + dof, s + so, static_cast<size_t>(run));
    int d = last - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < region.len[d]) {
        so += ss[d];
        dof += ds[d];
        break;
      }
      so -= (region.len[d] - 1) * ss[d];
      dof -= (region.len[d] - 1) * ds[d];
      idx[d] = 0;
    }
    if (d < 0) break;
  }
}

// ---------------------------------------------------------------- files

std::string errno_text(int err) { return std::strerror(err); }

namespace {
int open_or_throw(const std::string& path, int flags, const char* what) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw Error(str_cat("checkpoint: cannot ", what, " ", path, ": ", errno_text(errno)));
  return fd;
}
}  // namespace

namespace {
// Writes bytes [begin, end) of the concatenated chunks at the same offsets of fd; 0 or the errno of the failure.
int write_range(int fd, const std::vector<Chunk>& chunks, uint64_t begin, uint64_t end) {
  uint64_t pos = 0;  // offset of the current chunk in the file
  for (const Chunk& c : chunks) {
    const uint64_t lo = std::max<uint64_t>(pos, begin), hi = std::min<uint64_t>(pos + c.len, end);
    for (uint64_t at = lo; at < hi;) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(hi - at, uint64_t{1} << 30));
      const ssize_t n = ::pwrite(fd, static_cast<const char*>(c.data) + (at - pos), len, static_cast<off_t>(at));
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      if (n == 0) return ENOSPC;
      at += static_cast<uint64_t>(n);
    }
    pos += c.len;
    if (pos >= end) break;
  }
  return 0;
}
}  // namespace

void write_file_durable(const std::string& path, const std::vector<Chunk>& chunks, int threads) {
  int fd = open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC, "create");
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    throw Error(str_cat("checkpoint: ", what, " ", path, " failed: ", errno_text(err)));
  };
  uint64_t total = 0;
  for (const Chunk& c : chunks) total += c.len;
  constexpr uint64_t kMinRange = uint64_t{1} << 20;
  const uint64_t per = std::max<uint64_t>(kMinRange, (total / std::max(threads, 1) + 4095) / 4096 * 4096);
  const int n = threads > 1 ? static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads), (total + per - 1) / per)) : 1;
  if (n <= 1) {
    if (const int err = write_range(fd, chunks, 0, total)) fail("writing", err);
  } else {
    std::vector<int> errs(static_cast<size_t>(n), 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t)
      pool.emplace_back([&, t] {
        const uint64_t begin = per * static_cast<uint64_t>(t), end = std::min(total, begin + per);
        int err = write_range(fd, chunks, begin, end);
        // Start and wait for this range's writeback here, in parallel with the other ranges (the fsync below
        // then finds little left); a filesystem without sync_file_range leaves it all to the fsync.
        if (!err && ::sync_file_range(fd, static_cast<off_t>(begin), static_cast<off_t>(end - begin),
                                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0 &&
            errno != EINVAL && errno != ESPIPE && errno != ENOSYS)
          err = errno;
        errs[static_cast<size_t>(t)] = err;
      });
    for (std::thread& th : pool) th.join();
    for (int err : errs)
      if (err) fail("writing", err);
  }
  if (::fsync(fd) != 0) fail("fsync of", errno);
  if (::close(fd) != 0) throw Error(str_cat("checkpoint: closing ", path, " failed: ", errno_text(errno)));
}

void fsync_dir(const std::string& path) {
  int fd = open_or_throw(path, O_RDONLY | O_DIRECTORY, "open directory");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems refuse fsync on directories (EINVAL): nothing more can be done there.
  if (rc != 0 && err != EINVAL) throw Error(str_cat("checkpoint: fsync of directory ", path, " failed: ", errno_text(err)));
}

std::string read_text_file(const std::string& path) {
  int fd = open_or_throw(path, O_RDONLY, "open");
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw Error(str_cat("checkpoint: reading ", path, " failed: ", errno_text(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void remove_tree_quiet(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

MappedRange::MappedRange(const std::string& path, uint64_t offset, uint64_t len) : len_(len) {
  int fd = open_or_throw(path, O_RDONLY, "open shard file");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(str_cat("checkpoint: cannot stat ", path, ": ", errno_text(err)));
  }
  if (static_cast<uint64_t>(st.st_size) < offset + len) {
    ::close(fd);
    throw Error(str_cat("checkpoint: shard file ", path, " is truncated: it has ", st.st_size,
                        " bytes, the manifest needs ", offset + len));
  }
  if (len == 0) {
    ::close(fd);
    return;
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  map_len_ = static_cast<size_t>(offset + len - start);
  map_ = ::mmap(nullptr, map_len_, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(start));
  int err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw Error(str_cat("checkpoint: cannot map ", path, ": ", errno_text(err)));
  }
  ::madvise(map_, map_len_, MADV_SEQUENTIAL);
  data_ = static_cast<const uint8_t*>(map_) + (offset - start);
}

MappedRange::~MappedRange() {
  if (map_) ::munmap(map_, map_len_);
}

// ---------------------------------------------------------------- names

std::string iter_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

namespace {
// Parses "iter_<digits>" at the start of `name`; returns the number of characters used (0: none).
size_t parse_iter_prefix(const std::string& name, int64_t* iteration) {
  if (name.rfind("iter_", 0) != 0) return 0;
  size_t i = 5;
  int64_t v = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i < 5 + 18) v = v * 10 + (name[i++] - '0');
  if (i - 5 < 7) return 0;  // always at least 7 digits
  *iteration = v;
  return i;
}
}  // namespace

bool parse_iter_dir_name(const std::string& name, int64_t* iteration) {
  int64_t v = 0;
  size_t n = parse_iter_prefix(name, &v);
  if (n == 0 || n != name.size()) return false;
  *iteration = v;
  return true;
}

bool parse_leftover_dir_name(const std::string& name, int64_t* iteration) {
  int64_t v = 0;
  size_t n = parse_iter_prefix(name, &v);
  if (n == 0) return false;
  std::string rest = name.substr(n);
  if (rest.rfind(".tmp-", 0) != 0 && rest.rfind(".old-", 0) != 0) return false;
  *iteration = v;
  return true;
}

}  // namespace mt::ckpt::detail
