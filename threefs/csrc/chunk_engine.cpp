#include "chunk_engine.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "crc32c.h"

namespace threefs {
namespace {

constexpr uint32_t kMagic = 0x43534633;  // "3FSC"
constexpr size_t kHeader = 64;
constexpr size_t kBlock = 4096;  // each 4 KiB block of a chunk has its own CRC32C

size_t nblocks(size_t size) { return (size + kBlock - 1) / kBlock; }
// On-disk bytes of a chunk file: header, data, block CRC table.
uint64_t file_bytes(uint64_t size) { return kHeader + size + 4 * nblocks(size); }

// File: header (64) | data (size) | CRC32C of each 4 KiB block (u32 each).
// On-disk header: magic u32 | format u32 | version u64 | chain_ver u64 | size u32 | crc u32 |
// reserved (28 bytes) | header crc u32 (over the first 60 bytes).
struct Header {
  uint64_t ver = 0, chain_ver = 0;
  uint32_t size = 0, crc = 0;
};

void encode(const Header& h, char* out) {
  std::memset(out, 0, kHeader);
  uint32_t fmt = 2;
  std::memcpy(out, &kMagic, 4);
  std::memcpy(out + 4, &fmt, 4);
  std::memcpy(out + 8, &h.ver, 8);
  std::memcpy(out + 16, &h.chain_ver, 8);
  std::memcpy(out + 24, &h.size, 4);
  std::memcpy(out + 28, &h.crc, 4);
  uint32_t hc = crc32c(0, out, 60);
  std::memcpy(out + 60, &hc, 4);
}

bool decode(const char* in, Header* h) {
  uint32_t magic, fmt, hc;
  std::memcpy(&magic, in, 4);
  std::memcpy(&fmt, in + 4, 4);
  std::memcpy(&hc, in + 60, 4);
  if (magic != kMagic || fmt != 2 || hc != crc32c(0, in, 60)) return false;
  std::memcpy(&h->ver, in + 8, 8);
  std::memcpy(&h->chain_ver, in + 16, 8);
  std::memcpy(&h->size, in + 24, 4);
  std::memcpy(&h->crc, in + 28, 4);
  return true;
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

IoError sys_error(const std::string& what) {
  int e = errno;
  return IoError(e, what + ": " + std::strerror(e));
}

void pread_full(int fd, char* buf, size_t n, off_t off) {
  while (n > 0) {
    ssize_t r = ::pread(fd, buf, n, off);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw sys_error("pread");
    }
    if (r == 0) throw ChecksumError("chunk file shorter than its header says");
    buf += r;
    n -= r;
    off += r;
  }
}

bool read_header(int fd, Header* h) {
  char buf[kHeader];
  ssize_t r = ::pread(fd, buf, kHeader, 0);
  return r == (ssize_t)kHeader && decode(buf, h);
}

std::string hex(const std::string& id) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(id.size() * 2);
  for (unsigned char c : id) {
    s.push_back(d[c >> 4]);
    s.push_back(d[c & 15]);
  }
  return s;
}

bool unhex(const std::string& s, std::string* out) {
  if (s.size() % 2) return false;
  out->clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    auto v = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int a = v(s[i]), b = v(s[i + 1]);
    if (a < 0 || b < 0) return false;
    out->push_back(static_cast<char>(a * 16 + b));
  }
  return true;
}

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

off_t file_size(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? st.st_size : 0;
}
}  // namespace

ChunkEngine::ChunkEngine(const std::string& root, const std::string& fsync_policy,
                         uint64_t capacity_bytes, uint32_t max_chunk_size)
    : root_(root), capacity_(capacity_bytes), max_chunk_(max_chunk_size) {
  if (fsync_policy == "none")
    policy_ = FsyncPolicy::None;
  else if (fsync_policy == "data")
    policy_ = FsyncPolicy::Data;
  else if (fsync_policy == "full")
    policy_ = FsyncPolicy::Full;
  else
    throw std::invalid_argument("fsync_policy must be 'none', 'data' or 'full', got '" +
                                fsync_policy + "'");
  if (::mkdir(root_.c_str(), 0755) != 0 && errno != EEXIST) throw sys_error("mkdir " + root_);
  for (int i = 0; i < 256; i++) {
    char sub[4];
    std::snprintf(sub, sizeof sub, "%02x", i);
    std::string d = root_ + "/" + sub;
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) throw sys_error("mkdir " + d);
  }
  free_dir_ = root_ + "/free";
  if (::mkdir(free_dir_.c_str(), 0755) != 0 && errno != EEXIST) throw sys_error("mkdir " + free_dir_);
  recover();
}

ChunkEngine::ReadGuard::ReadGuard(ChunkEngine* eng) : e(eng) {
  std::lock_guard<std::mutex> g(e->mu_);
  it = e->readers_.insert(e->epoch_);
}

ChunkEngine::ReadGuard::~ReadGuard() {
  std::lock_guard<std::mutex> g(e->mu_);
  e->readers_.erase(it);
}

bool ChunkEngine::pool_has_room_locked(uint64_t bytes) const {
  return free_.size() + stashed_ < kMaxFree && free_bytes_ + bytes <= kMaxFreeBytes;
}

std::string ChunkEngine::stash(const std::string& path, uint64_t* bytes, int64_t known) {
  if (known >= 0) {  // the caller's metadata knows the size: no stat (link fails if absent)
    *bytes = static_cast<uint64_t>(known);
  } else {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return "";
    *bytes = static_cast<uint64_t>(st.st_size);
  }
  std::string q;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!pool_has_room_locked(*bytes)) return "";
    q = free_dir_ + "/" + std::to_string(free_seq_++) + ".f";
    stashed_++;
    free_bytes_ += *bytes;
  }
  if (::link(path.c_str(), q.c_str()) == 0) return q;
  std::lock_guard<std::mutex> g(mu_);
  stashed_--;
  free_bytes_ -= *bytes;
  return "";
}

void ChunkEngine::release(const std::string& pooled, uint64_t bytes, bool ok) {
  if (pooled.empty()) return;
  std::lock_guard<std::mutex> g(mu_);
  stashed_--;
  if (ok) {
    free_.push_back({pooled, ++epoch_, bytes});
  } else {
    free_bytes_ -= bytes;
    ::unlink(pooled.c_str());
  }
}

void ChunkEngine::recycle_locked(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;  // no such file
  uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (pool_has_room_locked(bytes)) {
    std::string q = free_dir_ + "/" + std::to_string(free_seq_++) + ".f";
    if (::rename(path.c_str(), q.c_str()) == 0) {
      free_.push_back({q, ++epoch_, bytes});
      free_bytes_ += bytes;
      return;
    }
  }
  ::unlink(path.c_str());
}

std::string ChunkEngine::take_free_locked() {
  if (free_.empty()) return "";
  // readers that started before the file entered the pool may still be reading it
  if (!readers_.empty() && *readers_.begin() < free_.front().epoch) return "";
  std::string q = free_.front().path;
  free_bytes_ -= free_.front().bytes;
  free_.pop_front();
  return q;
}

std::string ChunkEngine::dir_of(const std::string& id) const {
  char sub[4];
  std::snprintf(sub, sizeof sub, "%02x", crc32c(0, id.data(), id.size()) & 0xFF);
  return root_ + "/" + sub;
}

std::string ChunkEngine::chunk_path(const std::string& id, bool pending) const {
  return dir_of(id) + "/" + hex(id) + (pending ? ".p" : ".c");
}

void ChunkEngine::maybe_crash(const char* point) const {
  if (!crash_point_.empty() && crash_point_ == point) ::_exit(86);
}

void ChunkEngine::fsync_dir(const std::string& path) const {
  if (policy_ != FsyncPolicy::Full) return;
  Fd d(::open(path.c_str(), O_RDONLY | O_DIRECTORY));
  if (d.fd >= 0) ::fsync(d.fd);
}

void ChunkEngine::recover() {
  std::lock_guard<std::mutex> g(mu_);
  chunks_.clear();
  used_ = 0;
  free_.clear();
  free_bytes_ = 0;
  if (DIR* fd = ::opendir(free_dir_.c_str())) {
    std::vector<std::string> names;
    while (dirent* e = ::readdir(fd)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(fd);
    for (const auto& n : names) ::unlink((free_dir_ + "/" + n).c_str());
  }
  for (int i = 0; i < 256; i++) {
    char sub[4];
    std::snprintf(sub, sizeof sub, "%02x", i);
    std::string d = root_ + "/" + sub;
    DIR* dir = ::opendir(d.c_str());
    if (!dir) continue;
    std::vector<std::string> names;
    while (dirent* e = ::readdir(dir)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(dir);
    // committed files first so that pending ones can be compared with them
    for (int pass = 0; pass < 2; pass++) {
      for (const auto& n : names) {
        std::string p = d + "/" + n, id;
        if (ends_with(n, ".tmp")) {
          if (pass == 0) ::unlink(p.c_str());
          continue;
        }
        bool is_c = ends_with(n, ".c"), is_p = ends_with(n, ".p");
        if ((pass == 0 && !is_c) || (pass == 1 && !is_p)) continue;
        if (!unhex(n.substr(0, n.size() - 2), &id)) continue;
        Fd f(::open(p.c_str(), O_RDONLY));
        Header h;
        bool ok = f.fd >= 0 && read_header(f.fd, &h) && file_size(p) == off_t(file_bytes(h.size));
        if (is_c) {
          if (!ok) {  // unreadable committed file: keep it aside, sync will restore the chunk
            ::rename(p.c_str(), (p + ".bad").c_str());
            continue;
          }
          ChunkMeta& m = chunks_[id];
          m.committed_ver = h.ver;
          m.chain_ver = h.chain_ver;
          m.size = h.size;
          m.crc = h.crc;
          used_ += file_bytes(h.size);
        } else {
          auto it = chunks_.find(id);
          uint64_t cv = it == chunks_.end() ? 0 : it->second.committed_ver;
          if (!ok || h.ver <= cv) {
            ::unlink(p.c_str());
            continue;
          }
          ChunkMeta& m = chunks_[id];
          m.pending_ver = h.ver;
          m.pending_size = h.size;
          m.pending_crc = h.crc;
          m.chain_ver = std::max(m.chain_ver, h.chain_ver);
          used_ += file_bytes(h.size);
        }
      }
    }
  }
}

void ChunkEngine::write_file(const std::string& path, uint64_t ver, uint64_t chain_ver,
                             const std::vector<std::pair<const char*, size_t>>& parts,
                             size_t size, uint32_t crc, std::vector<uint32_t>* table_in,
                             int64_t old_bytes_hint) {
  // old_bytes_hint: what the caller's metadata says about the file at `path` (-2: none, >= 0:
  // its size, -1: unknown, stat it). The new content is written under a name no reader uses
  // (a pooled file's pool name, or path + ".tmp"), then renamed to `path`: a crash leaves
  // either the old file or the complete new one there (pool and .tmp are cleared on open).
  std::string tmp = path + ".tmp";
  std::string reuse;
  {
    std::lock_guard<std::mutex> g(mu_);
    reuse = take_free_locked();
  }
  Fd f(-1);
  off_t reused_size = -1;
  if (!reuse.empty()) {  // overwrite a pooled file in place: no block allocation or freeing
    f.fd = ::open(reuse.c_str(), O_WRONLY);
    struct stat st;
    if (f.fd >= 0 && ::fstat(f.fd, &st) == 0 && st.st_nlink == 1) {
      reused_size = st.st_size;
      tmp = reuse;  // written under its pool name, renamed over `path` below
    } else {
      if (f.fd >= 0) ::close(f.fd);
      f.fd = -1;
      ::unlink(reuse.c_str());
    }
  }
  if (f.fd < 0) f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (f.fd < 0) throw sys_error("open " + tmp);
  char hdr[kHeader];
  Header h;
  h.ver = ver;
  h.chain_ver = chain_ver;
  h.size = static_cast<uint32_t>(size);
  h.crc = crc;
  encode(h, hdr);
  // block CRC table: given (computed with the CRC in one pass), or over the parts as they lie
  std::vector<uint32_t> table;
  if (table_in) {
    table = std::move(*table_in);
  } else {
    table.assign(nblocks(size), 0);
    size_t pos = 0;
    for (auto& p : parts) {
      const char* q = p.first;
      size_t n = p.second;
      while (n) {
        size_t b = pos / kBlock, k = std::min(n, kBlock - pos % kBlock);
        table[b] = crc32c(table[b], q, k);
        q += k;
        n -= k;
        pos += k;
      }
    }
  }
  std::vector<iovec> iov;
  iov.push_back({hdr, kHeader});
  for (auto& p : parts)
    if (p.second) iov.push_back({const_cast<char*>(p.first), p.second});
  if (!table.empty()) iov.push_back({table.data(), table.size() * 4});
  size_t total = file_bytes(size), done = 0;
  size_t idx = 0;
  while (done < total) {
    ssize_t w = ::writev(f.fd, iov.data() + idx, static_cast<int>(iov.size() - idx));
    if (w < 0) {
      if (errno == EINTR) continue;
      IoError e = sys_error("write " + tmp);
      ::unlink(tmp.c_str());
      throw e;
    }
    done += w;
    while (idx < iov.size() && size_t(w) >= iov[idx].iov_len) {
      w -= iov[idx].iov_len;
      idx++;
    }
    if (idx < iov.size()) {
      iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + w;
      iov[idx].iov_len -= w;
    }
  }
  if (reused_size > off_t(total) && ::ftruncate(f.fd, off_t(total)) != 0) {
    IoError e = sys_error("ftruncate " + tmp);
    ::unlink(tmp.c_str());
    throw e;
  }
  if (policy_ != FsyncPolicy::None && ::fsync(f.fd) != 0) {
    IoError e = sys_error("fsync " + tmp);
    ::unlink(tmp.c_str());
    throw e;
  }
  maybe_crash("after_data_write");
  uint64_t old_bytes = 0;
  // the file this rename replaces goes to the pool
  std::string old = old_bytes_hint == -2 ? "" : stash(path, &old_bytes, old_bytes_hint);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    IoError e = sys_error("rename " + tmp);
    release(old, old_bytes, false);
    ::unlink(tmp.c_str());
    throw e;
  }
  release(old, old_bytes, true);
  fsync_dir(path.substr(0, path.rfind('/')));
}

ChunkMeta ChunkEngine::update(const std::string& id, uint64_t ver, uint64_t chain_ver,
                              uint64_t offset, const char* data, size_t len, int64_t truncate_to,
                              bool full_replace, const uint32_t* sums_blocks, uint32_t sums_crc) {
  if (offset + len > max_chunk_ || (truncate_to >= 0 && uint64_t(truncate_to) > max_chunk_))
    throw std::invalid_argument("update beyond the maximum chunk size " +
                                std::to_string(max_chunk_));
  ChunkMeta m;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = chunks_.find(id);
    if (it != chunks_.end()) m = it->second;
  }
  uint64_t latest = m.pending_ver ? m.pending_ver : m.committed_ver;
  if (!full_replace && ver != latest + 1)
    throw VersionError("update version " + std::to_string(ver) + " does not follow " +
                       std::to_string(latest));
  if (ver == 0) throw VersionError("update version must be >= 1");
  // base content: pending if there is one, else committed (copy-on-write, never in place)
  uint32_t base_size = full_replace ? 0 : (m.pending_ver ? m.pending_size : m.size);
  size_t new_size = std::max<uint64_t>(base_size, offset + len);
  if (truncate_to >= 0) new_size = static_cast<size_t>(truncate_to);
  std::vector<char> base;
  bool need_base = base_size > 0 && !(offset == 0 && len >= new_size);
  if (need_base) {
    ReadGuard rg(this);
    base.assign(std::max<size_t>(base_size, new_size), 0);
    std::string src = chunk_path(id, m.pending_ver != 0);
    Fd f(::open(src.c_str(), O_RDONLY));
    if (f.fd < 0) throw sys_error("open " + src);
    pread_full(f.fd, base.data(), base_size, kHeader);
  }
  // assemble [0, new_size): base bytes, zeros, the new data
  std::vector<std::pair<const char*, size_t>> parts;
  std::vector<char> zeros;
  size_t data_end = std::min<size_t>(offset + len, new_size);
  if (need_base) {
    if (offset < new_size) std::memcpy(base.data() + offset, data, data_end - offset);
    parts.push_back({base.data(), new_size});
  } else {
    size_t lead = std::min<size_t>(offset, new_size);
    size_t tail = new_size - std::max<size_t>(data_end, lead);
    if (lead || tail) zeros.assign(std::max(lead, tail), 0);
    if (lead) parts.push_back({zeros.data(), lead});
    if (data_end > offset) parts.push_back({data, data_end - offset});
    if (tail) parts.push_back({zeros.data(), tail});
  }
  uint32_t crc = 0;
  std::vector<uint32_t> table;
  if (sums_blocks && !need_base && offset == 0 && len == new_size && new_size > 0) {
    table.assign(sums_blocks, sums_blocks + nblocks(new_size));  // the caller's pass over data
    crc = sums_crc;
  } else if (parts.size() == 1 && parts[0].second == new_size) {  // CRC and block CRCs, 1 pass
    table.assign(nblocks(new_size), 0);
    crc = crc32c_blocks(parts[0].first, new_size, table.data());
  } else {
    for (auto& p : parts) crc = crc32c(crc, p.first, p.second);
  }
  // the new file's bytes are claimed at the check (a reservation of this chunk's taken over), so that concurrent
  // updates of other chunks cannot all pass it and overfill the target
  const uint64_t claim = file_bytes(new_size);
  {
    std::lock_guard<std::mutex> g(mu_);
    uint64_t old_pending = m.pending_ver ? file_bytes(m.pending_size) : 0;
    used_ -= take_reserved_locked(id);
    claim_locked(old_pending, claim);
  }
  try {
    write_file(chunk_path(id, true), ver, chain_ver, parts, new_size, crc,
               table.empty() ? nullptr : &table,
               m.pending_ver ? int64_t(file_bytes(m.pending_size)) : -2);
  } catch (...) {
    std::lock_guard<std::mutex> g(mu_);
    used_ -= claim;
    throw;
  }
  maybe_crash("after_pending_rename");
  std::lock_guard<std::mutex> g(mu_);
  ChunkMeta& cur = chunks_[id];
  if (cur.pending_ver) used_ -= file_bytes(cur.pending_size);
  cur.pending_ver = ver;
  cur.pending_size = static_cast<uint32_t>(new_size);
  cur.pending_crc = crc;
  cur.chain_ver = chain_ver;
  return cur;
}

void ChunkEngine::claim_locked(uint64_t freed, uint64_t claim) {
  if (used_ - freed + claim > capacity_)
    throw IoError(ENOSPC, "no space left on the storage target (capacity " + std::to_string(capacity_) + " bytes)");
  used_ += claim;
}

uint64_t ChunkEngine::take_reserved_locked(const std::string& id) {
  auto it = reserved_.find(id);
  if (it == reserved_.end()) return 0;
  uint64_t bytes = it->second;
  reserved_.erase(it);
  return bytes;
}

void ChunkEngine::reserve(const std::string& id, uint64_t new_size) {
  std::lock_guard<std::mutex> g(mu_);
  used_ -= take_reserved_locked(id);
  auto it = chunks_.find(id);
  uint64_t old_pending = it != chunks_.end() && it->second.pending_ver ? file_bytes(it->second.pending_size) : 0;
  const uint64_t claim = file_bytes(new_size);
  claim_locked(old_pending, claim);
  reserved_[id] = claim;
}

void ChunkEngine::unreserve(const std::string& id) {
  std::lock_guard<std::mutex> g(mu_);
  used_ -= take_reserved_locked(id);
}

bool ChunkEngine::commit(const std::string& id, uint64_t ver) {
  ChunkMeta m;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = chunks_.find(id);
    if (it == chunks_.end()) throw VersionError("commit of an unknown chunk");
    m = it->second;
  }
  if (m.pending_ver != ver) {
    if (m.committed_ver >= ver) return false;
    throw VersionError("commit version " + std::to_string(ver) + " but pending is " +
                       std::to_string(m.pending_ver));
  }
  maybe_crash("before_commit_rename");
  std::string p = chunk_path(id, true), c = chunk_path(id, false);
  uint64_t old_bytes = 0;
  std::string old = m.committed_ver ? stash(c, &old_bytes, int64_t(file_bytes(m.size))) : "";
  if (::rename(p.c_str(), c.c_str()) != 0) {
    IoError e = sys_error("rename " + p);
    release(old, old_bytes, false);
    throw e;
  }
  release(old, old_bytes, true);
  fsync_dir(dir_of(id));
  maybe_crash("after_commit_rename");
  std::lock_guard<std::mutex> g(mu_);
  ChunkMeta& cur = chunks_[id];
  if (cur.committed_ver) used_ -= file_bytes(cur.size);
  cur.committed_ver = ver;
  cur.size = cur.pending_size;
  cur.crc = cur.pending_crc;
  cur.pending_ver = 0;
  cur.pending_size = cur.pending_crc = 0;
  return true;
}

ChunkMeta ChunkEngine::replace_committed(const std::string& id, uint64_t ver, uint64_t chain_ver,
                                         const char* data, size_t len) {
  if (len > max_chunk_) throw std::invalid_argument("chunk larger than the maximum chunk size");
  std::vector<uint32_t> table(nblocks(len), 0);
  uint32_t crc = crc32c_blocks(data, len, table.data());
  ChunkMeta m;
  const uint64_t claim = file_bytes(len);  // claimed at the check, as update() does, so that concurrent syncs
  {                                        // of other chunks cannot all pass it and overfill the target
    std::lock_guard<std::mutex> g(mu_);
    auto it = chunks_.find(id);
    if (it != chunks_.end()) m = it->second;
    uint64_t old = (m.committed_ver ? file_bytes(m.size) : 0);
    claim_locked(old, claim);
  }
  try {
    write_file(chunk_path(id, false), ver, chain_ver, {{data, len}}, len, crc, &table);
  } catch (...) {
    std::lock_guard<std::mutex> g(mu_);
    used_ -= claim;
    throw;
  }
  std::lock_guard<std::mutex> g(mu_);
  if (m.pending_ver) recycle_locked(chunk_path(id, true));
  ChunkMeta& cur = chunks_[id];
  if (cur.committed_ver) used_ -= file_bytes(cur.size);
  if (cur.pending_ver) used_ -= file_bytes(cur.pending_size);
  cur.committed_ver = ver;
  cur.chain_ver = chain_ver;
  cur.size = static_cast<uint32_t>(len);
  cur.crc = crc;
  cur.pending_ver = 0;
  cur.pending_size = cur.pending_crc = 0;
  return cur;
}

bool ChunkEngine::abort(const std::string& id, uint64_t ver) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end() || it->second.pending_ver != ver) return false;
  recycle_locked(chunk_path(id, true));
  used_ -= file_bytes(it->second.pending_size);
  it->second.pending_ver = 0;
  it->second.pending_size = it->second.pending_crc = 0;
  if (!it->second.committed_ver) chunks_.erase(it);
  return true;
}

bool ChunkEngine::read(const std::string& id, uint64_t offset, uint64_t length, bool verify,
                       const std::function<char*(size_t)>& alloc, bool pending) {
  ReadGuard rg(this);
  std::string c = chunk_path(id, pending);
  Fd f(::open(c.c_str(), O_RDONLY));
  if (f.fd < 0) {
    if (errno == ENOENT) return false;
    throw sys_error("open " + c);
  }
  Header h;
  if (!read_header(f.fd, &h)) throw ChecksumError("corrupt chunk header in " + c);
  size_t n = offset >= h.size ? 0 : std::min<uint64_t>(length, h.size - offset);
  if (!verify) {
    char* out = alloc(n);
    if (n) pread_full(f.fd, out, n, kHeader + offset);
    return true;
  }
  if (offset == 0 && n == h.size) {
    char* out = alloc(n);
    if (n) pread_full(f.fd, out, n, kHeader);
    if (crc32c(0, out, n) != h.crc) throw ChecksumError("checksum mismatch in " + c);
    return true;
  }
  // partial read: verify only the 4 KiB blocks it touches, against the block CRC table
  if (n == 0) {
    alloc(0);
    return true;
  }
  size_t b0 = offset / kBlock, b1 = (offset + n - 1) / kBlock;
  size_t lo = b0 * kBlock, hi = std::min<size_t>((b1 + 1) * kBlock, h.size);
  std::vector<char> span(hi - lo);
  std::vector<uint32_t> crcs(b1 - b0 + 1);
  pread_full(f.fd, span.data(), span.size(), kHeader + lo);
  pread_full(f.fd, reinterpret_cast<char*>(crcs.data()), crcs.size() * 4,
             kHeader + h.size + 4 * b0);
  for (size_t b = b0; b <= b1; b++) {
    size_t s0 = b * kBlock - lo, len = std::min<size_t>(kBlock, h.size - b * kBlock);
    if (crc32c(0, span.data() + s0, len) != crcs[b - b0])
      throw ChecksumError("checksum mismatch in block " + std::to_string(b) + " of " + c);
  }
  char* out = alloc(n);
  std::memcpy(out, span.data() + (offset - lo), n);
  return true;
}

int ChunkEngine::open_span(const std::string& id, uint64_t offset, uint64_t length, Span* s) {
  {
    std::lock_guard<std::mutex> g(mu_);  // a reader entry: the file is not recycled meanwhile
    s->lease = ++next_lease_;
    leases_[s->lease] = readers_.insert(epoch_);
  }
  try {
    std::string c = chunk_path(id, false);
    s->fd = ::open(c.c_str(), O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
      if (errno == ENOENT) {
        close_span(s);
        return 0;
      }
      throw sys_error("open " + c);
    }
    Header h;
    if (!read_header(s->fd, &h)) throw ChecksumError("corrupt chunk header in " + c);
    uint64_t n = offset >= h.size ? 0 : std::min<uint64_t>(length, h.size - offset);
    uint64_t end = offset + n;
    if (n == 0 || offset % kBlock || (end % kBlock && end != h.size)) {
      close_span(s);
      return 2;
    }
    s->size = h.size;
    s->file_offset = kHeader + offset;
    s->n = n;
    s->whole = offset == 0 && n == h.size;
    s->crc = h.crc;
    if (!s->whole) {
      size_t b0 = offset / kBlock, nb = nblocks(n);
      s->crcs.resize(nb);
      pread_full(s->fd, reinterpret_cast<char*>(s->crcs.data()), nb * 4,
                 kHeader + h.size + 4 * b0);
    }
    return 1;
  } catch (...) {
    close_span(s);
    throw;
  }
}

void ChunkEngine::close_span(Span* s) {
  if (s->fd >= 0) ::close(s->fd);
  s->fd = -1;
  std::lock_guard<std::mutex> g(mu_);
  auto it = leases_.find(s->lease);
  if (it != leases_.end()) {
    readers_.erase(it->second);
    leases_.erase(it);
  }
  s->lease = 0;
}

std::optional<ChunkMeta> ChunkEngine::meta(const std::string& id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<std::string, ChunkMeta>> ChunkEngine::list(const std::string& prefix,
                                                                 size_t limit) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::pair<std::string, ChunkMeta>> out;
  for (auto it = chunks_.lower_bound(prefix); it != chunks_.end() && out.size() < limit; ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(*it);
  }
  return out;
}

bool ChunkEngine::remove(const std::string& id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return false;
  recycle_locked(chunk_path(id, true));  // a missing file is skipped
  recycle_locked(chunk_path(id, false));
  if (it->second.committed_ver) used_ -= file_bytes(it->second.size);
  if (it->second.pending_ver) used_ -= file_bytes(it->second.pending_size);
  chunks_.erase(it);
  return true;
}

uint64_t ChunkEngine::used_bytes() {
  std::lock_guard<std::mutex> g(mu_);
  return used_;
}

size_t ChunkEngine::chunk_count() {
  std::lock_guard<std::mutex> g(mu_);
  return chunks_.size();
}

}  // namespace threefs
