// Chunk engine: chunks as files on a local disk, with per-chunk metadata and CRC32C.
//
// Each chunk id (opaque bytes; threefs uses inode id u64 BE + chunk index u32 BE) owns at most two
// files under root/<xx>/<hex id>:
//   <hex>.c   the committed version   (64-byte header + data + CRC32C of each 4 KiB block)
//   <hex>.p   the pending version     (same layout)
// The header holds the CRC32C of the whole data (the chunk's checksum in its metadata); partial
// reads verify only the 4 KiB blocks they touch, whole-chunk reads the whole-data CRC.
// Updates are copy-on-write: the new content goes to <hex>.p.tmp, is (optionally) fsynced and is
// renamed to <hex>.p; commit renames <hex>.p over <hex>.c. A rename is atomic, so after a crash at
// any point a chunk is either at its old or at its new state; leftover *.tmp files and pending
// files that are not newer than the committed one are removed when the engine opens.
#pragma once
#include <cstdint>
#include <deque>
#include <set>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace threefs {

struct ChunkMeta {
  uint64_t committed_ver = 0;  // 0: nothing committed yet
  uint64_t pending_ver = 0;    // 0: no pending version
  uint64_t chain_ver = 0;      // chain version of the last update
  uint32_t size = 0;           // committed size in bytes
  uint32_t crc = 0;            // CRC32C of the committed data
  uint32_t pending_size = 0;
  uint32_t pending_crc = 0;
};

struct IoError : std::runtime_error {
  int err;
  IoError(int e, const std::string& what) : std::runtime_error(what), err(e) {}
};
struct ChecksumError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct VersionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class FsyncPolicy { None, Data, Full };

class ChunkEngine {
 public:
  ChunkEngine(const std::string& root, const std::string& fsync_policy, uint64_t capacity_bytes,
              uint32_t max_chunk_size);

  // Create pending version `ver` = (latest content, or nothing if full_replace) with `len` bytes of
  // `data` written at `offset`; then, if truncate_to >= 0, the size is set to truncate_to.
  // Without full_replace, ver must be latest_version + 1 (else VersionError).
  // sums: the CRC32C of `data` and its 4 KiB block CRCs (crc32c_blocks), computed by the caller
  // over these same bytes; used (instead of a second pass) when `data` is the whole new content.
  ChunkMeta update(const std::string& id, uint64_t ver, uint64_t chain_ver, uint64_t offset,
                   const char* data, size_t len, int64_t truncate_to, bool full_replace,
                   const uint32_t* sums_blocks = nullptr, uint32_t sums_crc = 0);
  // Make pending version `ver` the committed one. Returns false if it already was committed.
  bool commit(const std::string& id, uint64_t ver);
  // Write `data` directly as committed version `ver` (sync / repair), dropping any pending one.
  ChunkMeta replace_committed(const std::string& id, uint64_t ver, uint64_t chain_ver,
                              const char* data, size_t len);
  // Read committed bytes [offset, offset+length) into a buffer from `alloc(n)`. Returns false when
  // the chunk has no committed version. Throws ChecksumError when verify and the CRC mismatches.
  bool read(const std::string& id, uint64_t offset, uint64_t length, bool verify,
            const std::function<char*(size_t)>& alloc, bool pending = false);
  // Zero-copy reads: open the committed file of `id` for sending bytes [offset, offset+length)
  // straight from it (sendfile), without reading or verifying them here; the receiver verifies
  // them against the CRC32C values returned with the span. Returns 0 when there is no committed
  // version, 2 when the range is not 4 KiB-block aligned (its end may be the chunk's end; the
  // caller then uses read()), 1 with *span filled. The span holds an open descriptor and keeps
  // the file out of reuse (recycling) until close_span.
  struct Span {
    int fd = -1;
    uint64_t file_offset = 0, n = 0, lease = 0;
    uint32_t size = 0;
    bool whole = false;          // n bytes are the whole chunk: check against crc
    uint32_t crc = 0;            // CRC32C of the whole chunk
    std::vector<uint32_t> crcs;  // otherwise: CRC32C of each 4 KiB block of the range
  };
  int open_span(const std::string& id, uint64_t offset, uint64_t length, Span* span);
  void close_span(Span* span);
  // Drop pending version `ver` (a successor refused it). Returns false if it is not pending.
  bool abort(const std::string& id, uint64_t ver);
  // Take the space of a new pending version of `id` of new_size bytes now (IoError ENOSPC if it does not fit),
  // before the write goes on down the chain: a write this target cannot hold then fails before any successor
  // applies it. The next update() of `id` uses it; unreserve() gives back what no update used (no-op otherwise).
  void reserve(const std::string& id, uint64_t new_size);
  void unreserve(const std::string& id);
  std::optional<ChunkMeta> meta(const std::string& id);
  std::vector<std::pair<std::string, ChunkMeta>> list(const std::string& prefix, size_t limit);
  bool remove(const std::string& id);
  std::string chunk_path(const std::string& id, bool pending) const;
  uint64_t used_bytes();
  uint64_t capacity_bytes() const { return capacity_; }
  size_t chunk_count();
  void set_crash_point(const std::string& p) { crash_point_ = p; }
  const std::string& root() const { return root_; }
  uint32_t max_chunk_size() const { return max_chunk_; }

 private:
  void recover();
  void maybe_crash(const char* point) const;
  void write_file(const std::string& path, uint64_t ver, uint64_t chain_ver,
                  const std::vector<std::pair<const char*, size_t>>& parts, size_t size,
                  uint32_t crc, std::vector<uint32_t>* table = nullptr,
                  int64_t old_bytes = -1);
  void fsync_dir(const std::string& path) const;
  std::string dir_of(const std::string& id) const;

  // File recycling. Copy-on-write replaces a chunk file by a new one on every update; creating
  // a file and freeing the replaced one (ext4 block allocation, page and block freeing) costs
  // several times the data write itself. Replaced and removed files therefore go to a pool
  // (root/free, at most kMaxFree files and kMaxFreeBytes bytes) and are overwritten in place (under their pool name, then renamed to their new name). A pooled file is
  // reused only when no read that may still hold it open is in progress (epochs: `epoch_` ticks
  // when a file enters the pool, each read records the epoch it started at). The pool is
  // emptied on open, since after a crash a pooled name may still alias a live chunk file.
  struct ReadGuard {
    ChunkEngine* e;
    std::multiset<uint64_t>::iterator it;
    explicit ReadGuard(ChunkEngine* eng);
    ~ReadGuard();
  };
  bool pool_has_room_locked(uint64_t bytes) const;
  // hard-link a file a rename will replace (its size: known >= 0, else stat'ed); after it
  std::string stash(const std::string& path, uint64_t* bytes, int64_t known = -1);
  void release(const std::string& pooled, uint64_t bytes, bool ok);
  void recycle_locked(const std::string& path);       // instead of unlink (mu_ held)
  std::string take_free_locked();                     // a reusable pool file, or ""
  std::string free_dir_;
  struct Pooled {
    std::string path;
    uint64_t epoch, bytes;
  };
  std::deque<Pooled> free_;
  uint64_t free_bytes_ = 0;
  std::multiset<uint64_t> readers_;
  std::map<uint64_t, std::multiset<uint64_t>::iterator> leases_;  // open spans' reader entries
  uint64_t next_lease_ = 0;
  uint64_t epoch_ = 0, free_seq_ = 0;
  size_t stashed_ = 0;
  static constexpr size_t kMaxFree = 256;
  static constexpr uint64_t kMaxFreeBytes = 128ull << 20;

  std::string root_;
  FsyncPolicy policy_;
  uint64_t capacity_;
  uint32_t max_chunk_;
  std::string crash_point_;
  std::mutex mu_;
  std::map<std::string, ChunkMeta> chunks_;
  std::map<std::string, uint64_t> reserved_;  // reserve()d bytes per chunk, counted in used_
  uint64_t used_ = 0;
  uint64_t take_reserved_locked(const std::string& id);  // a chunk's reservation, out of used_ and the map
  // count `claim` new bytes in used_ where `freed` counted bytes are about to go; IoError ENOSPC if they do not fit
  void claim_locked(uint64_t freed, uint64_t claim);
};

}  // namespace threefs
