// The storage node's full-chunk write data path in C++ (no Python, no GIL), beside the Python
// RPC server of storage.py, speaking the same frames (rpc.py) and keeping the same checks.
//
// FastPath::serve runs the request loop of one authenticated server connection: it receives
// each frame (header, JSON meta, payload into the caller's reusable buffer) and handles a CRAQ
// forward of a full chunk ("fwd", kind 3) itself when everything about it is ordinary: frame
// MAC and payload CRC32C correct, the chain known at exactly the request's chain version, this
// node's target in the chain's write list, the successor's address known. It then does what
// StorageNode._fwd does - forward to the successor first (kind 3, from the same buffer), write
// the copy-on-write pending version meanwhile, wait for the successor's ack, commit, answer -
// under the same per-chunk lock (LockTable, shared with Python). Every other frame (client
// requests, partial writes, anything unusual, including frames it would reject) goes back to
// Python, which verifies and handles it as before.
// FastPath::head_write is the head's half of a full-chunk write (forward + local update + ack)
// for StorageNode._write, which checked the client's frame and the chain.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "chunk_engine.h"

namespace threefs {

// One mutex per key, created on demand and dropped when unused (storage.py's chunk locks).
class LockTable {
 public:
  void acquire(const std::string& key);
  void release(const std::string& key);

 private:
  struct Entry {
    std::mutex m;
    int refs = 0;
  };
  std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Entry>> locks_;
};

// An authenticated connection to a successor: descriptor, session key, frame sequence numbers.
struct Conn {
  int fd = -1;
  uint8_t key[32];
  uint64_t send_seq = 0, recv_seq = 0;
};

// What the chain table says about one chain, for this node (set from Python on every routing).
struct ChainInfo {
  uint64_t ver = 0;
  int64_t tid = -1;          // this node's target on the chain, -1: none
  bool writes = false;       // the target is in the write list (and a successor, if any, has an address)
  bool head = false;         // ... and first in it
  std::string succ_addr;     // "host:port" of the successor, "" for the tail
};

// A frame serve() hands to Python: 36 header + MAC bytes, the meta bytes, and whether the
// payload is already in the buffer (it is when it fits).
struct RawFrame {
  std::string hdr, meta;
  bool have_data = false;
};

// AES-128-GMAC (AES-GCM with only associated data) through the system's libcrypto, loaded at
// run time (no build dependency); false when it is not there (then Python checks those frames).
bool gmac_available();
bool gmac(const uint8_t key[16], const uint8_t nonce[12], const void* data, size_t len,
          uint8_t tag[16]);

// The JSON meta reader of the data path, for tests: false when the text is not a JSON object it
// takes (it then leaves the frame to Python); else the top-level members that are integers
// (62 bits), strings, booleans or null (type 'i', 's', 'b', 'n'; others 'x').
struct JsonMember {
  char type;
  int64_t i;
  std::string s;
};
bool json_members(const std::string& text, std::map<std::string, JsonMember>* out);

class FastPath {
 public:
  explicit FastPath(std::string secret) : secret_(std::move(secret)) {}
  ~FastPath();
  void add_engine(int64_t tid, ChunkEngine* e) { engines_[tid] = e; }
  void set_chains(std::unordered_map<int64_t, ChainInfo> chains);
  LockTable& locks() { return locks_; }

  // Serve a connection until a frame for Python (returns 0, *out set), a clean close at a frame
  // boundary (1), a malformed frame (2, *err), or a socket error (3, *err).
  // flags: the connection's payload MAC (rpc.py); with AES-GMAC (2) and libcrypto at hand, full-
  // chunk client writes to a chain head are handled here too (StorageNode._write).
  int serve(int fd, const uint8_t key[32], int flags, uint64_t* recv_seq, uint64_t* send_seq,
            char* buf, size_t buf_len, RawFrame* out, std::string* err);
  // The head's forward + local update + ack of a full chunk. Returns 0 (done), 1 (*err holds
  // the successor's error answer, JSON), 2 (*err: the successor could not be reached or broke
  // the protocol). Local update errors are thrown (after dropping the forward).
  int head_write(int64_t tid, int64_t chain, uint64_t chain_ver, const std::string& cid,
                 uint64_t ver, const char* data, size_t len, uint32_t crc,
                 const uint32_t* blocks, const std::string& succ_addr, std::string* err);
  uint64_t handled() const { return handled_; }

 private:
  int send_answer(int fd, const uint8_t key[32], uint64_t* send_seq, const std::string& answer);
  int try_fwd(int fd, const uint8_t key[32], const uint8_t* hdr, const std::string& meta,
              const char* data, size_t len, uint64_t* recv_seq, uint64_t* send_seq);
  int try_write(int fd, const uint8_t key[32], const uint8_t gkey[16], const uint8_t* hdr,
                const std::string& meta, const char* data, size_t len, uint64_t* recv_seq,
                uint64_t* send_seq);
  bool get_conn(const std::string& addr, Conn* c, std::string* err);
  void put_conn(const std::string& addr, Conn c);
  // forward (kind 3) then local(), then the successor's answer: 0 ok, 1 answer err, 2 conn err
  template <class F>
  int forward_around(const std::string& addr, const std::string& fwd_meta, const char* data,
                     size_t len, F&& local, std::string* err);

  std::string secret_;
  std::map<int64_t, ChunkEngine*> engines_;
  std::mutex mu_;  // chains_ and pool_
  std::unordered_map<int64_t, ChainInfo> chains_;
  std::map<std::string, std::vector<Conn>> pool_;
  LockTable locks_;
  std::atomic<uint64_t> handled_{0};  // requests answered here (all connection threads)
};

}  // namespace threefs
