#include "fastpath.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <type_traits>

#include "crc32c.h"
#include "sha256.h"

namespace threefs {
namespace {

constexpr size_t kHdr = 20, kMac = 16, kMaxMeta = 1 << 20, kMaxData = 64 << 20;
constexpr int kSockBuf = 4 << 20;
constexpr int kConnectMs = 2000, kIoSec = 10;  // rpc.Client's connect_timeout and timeout

uint64_t get_be(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = v << 8 | p[i];
  return v;
}
void put_be(uint8_t* p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--) p[i] = uint8_t(v), v >>= 8;
}
std::string errstr(int e) { return std::strerror(e); }

// Receive exactly n bytes (fewer only at end of stream: *got tells). 0 or -errno.
int recv_all(int fd, void* p, size_t n, size_t* got) {
  *got = 0;
  while (*got < n) {
    ssize_t r = ::recv(fd, static_cast<char*>(p) + *got, n - *got, MSG_WAITALL);
    if (r == 0) return 0;
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    *got += size_t(r);
  }
  return 0;
}

// Send header + MAC + meta (+ payload) as one frame; the MAC covers header + meta, which is the
// whole frame MAC of rpc.py for kinds 1 (without payload) and 3. 0 or -errno.
int send_frame(int fd, const uint8_t key[32], uint64_t* seq, uint8_t kind, const std::string& meta,
               const char* data, size_t len) {
  uint8_t hdr[kHdr + 32];
  hdr[0] = '3', hdr[1] = 'F', hdr[2] = 1, hdr[3] = kind;
  put_be(hdr + 4, *seq, 8);
  put_be(hdr + 12, meta.size(), 4);
  put_be(hdr + 16, len, 4);
  hmac_sha256(key, 32, {{hdr, kHdr}, {meta.data(), meta.size()}}, hdr + kHdr);
  ++*seq;
  iovec iov[3] = {{hdr, kHdr + kMac}, {const_cast<char*>(meta.data()), meta.size()},
                  {const_cast<char*>(data), len}};
  int n = len ? 3 : 2, i = 0;
  while (i < n) {
    msghdr mh{};
    mh.msg_iov = iov + i;
    mh.msg_iovlen = n - i;
    ssize_t r = ::sendmsg(fd, &mh, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    size_t s = size_t(r);
    while (i < n && s >= iov[i].iov_len) s -= iov[i].iov_len, i++;
    if (i < n) iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + s, iov[i].iov_len -= s;
  }
  return 0;
}

bool mac_ok(const uint8_t key[32], const uint8_t* hdr, const std::string& meta) {
  uint8_t m[32];
  hmac_sha256(key, 32, {{hdr, kHdr}, {meta.data(), meta.size()}}, m);
  uint8_t d = 0;
  for (size_t i = 0; i < kMac; i++) d |= m[i] ^ hdr[kHdr + i];
  return d == 0;
}

// --- a small JSON reader for the flat objects of the RPC meta ----------------------------------
struct JVal {
  char type = 'x';  // 'i' integer, 's' string, 'b' bool, 'n' null, 'x' anything else
  int64_t i = 0;
  bool b = false;
  std::string s;
};
using JObj = std::map<std::string, JVal>;

struct JReader {
  const char* p;
  const char* end;
  void ws() {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
  }
  bool str(std::string* out) {  // at '"'; escapes decoded
    if (p >= end || *p != '"') return false;
    for (p++; p < end; p++) {
      char c = *p;
      if (c == '"') return p++, true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (++p >= end) return false;
      switch (*p) {
        case '"': case '\\': case '/': out->push_back(*p); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u':
          if (end - p < 5) return false;
        {  // decoded as Python does for ASCII; other code units as their 3-byte UTF-8 form
          // (surrogates included), which equals no ASCII text, as in Python
          unsigned cp = 0;
          for (int i = 1; i <= 4; i++) {
            if (!std::isxdigit(static_cast<unsigned char>(p[i]))) return false;
            cp = cp * 16 + unsigned(std::isdigit(static_cast<unsigned char>(p[i]))
                                        ? p[i] - '0'
                                        : (std::tolower(static_cast<unsigned char>(p[i])) - 'a' + 10));
          }
          if (cp < 0x80) {
            out->push_back(char(cp));
          } else if (cp < 0x800) {
            out->push_back(char(0xC0 | cp >> 6)), out->push_back(char(0x80 | (cp & 63)));
          } else {
            out->push_back(char(0xE0 | cp >> 12)), out->push_back(char(0x80 | (cp >> 6 & 63)));
            out->push_back(char(0x80 | (cp & 63)));
          }
          p += 4;
          break;
        }
        default: return false;
      }
    }
    return false;
  }
  bool skip(int depth) {  // any value, nested ones included
    ws();
    if (p >= end || depth > 64) return false;
    if (*p == '"') {
      std::string t;
      return str(&t);
    }
    if (*p == '{' || *p == '[') {
      char close = *p == '{' ? '}' : ']';
      bool obj = *p == '{';
      p++, ws();
      if (p < end && *p == close) return p++, true;
      for (;;) {
        if (obj) {
          std::string k;
          ws();
          if (!str(&k)) return false;
          ws();
          if (p >= end || *p++ != ':') return false;
        }
        if (!skip(depth + 1)) return false;
        ws();
        if (p < end && *p == ',') {
          p++;
          continue;
        }
        return p < end && *p++ == close;
      }
    }
    for (const char* lit : {"true", "false", "null"}) {
      size_t n = std::strlen(lit);
      if (size_t(end - p) >= n && !std::memcmp(p, lit, n)) return p += n, true;
    }
    return number();
  }
  // a JSON number (RFC 8259 grammar); p moves past it
  bool number() {
    auto digit = [&] { return p < end && *p >= '0' && *p <= '9'; };
    if (p < end && *p == '-') p++;
    if (!digit()) return false;
    if (*p == '0') {
      p++;
    } else {
      while (digit()) p++;
    }
    if (p < end && *p == '.') {
      p++;
      if (!digit()) return false;
      while (digit()) p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      p++;
      if (p < end && (*p == '+' || *p == '-')) p++;
      if (!digit()) return false;
      while (digit()) p++;
    }
    return true;
  }
  bool value(JVal* v) {
    ws();
    if (p >= end) return false;
    if (*p == '"') return v->type = 's', str(&v->s);
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
      const char* s = p;
      if (!number()) return false;
      // an integer that fits in 62 bits is type 'i'; fractions, exponents, larger ones 'x'
      bool neg = *s == '-';
      const char* q = s + neg;
      if (std::find_if(q, p, [](char c) { return c < '0' || c > '9'; }) != p || p - q > 18)
        return true;
      int64_t x = 0;
      for (; q < p; q++) x = x * 10 + (*q - '0');
      v->type = 'i', v->i = neg ? -x : x;
      return true;
    }
    if (end - p >= 4 && !std::memcmp(p, "true", 4)) return p += 4, v->type = 'b', v->b = true;
    if (end - p >= 5 && !std::memcmp(p, "false", 5)) return p += 5, v->type = 'b', v->b = false, true;
    if (end - p >= 4 && !std::memcmp(p, "null", 4)) return p += 4, v->type = 'n', true;
    return skip(0);  // nested object or array: type 'x'
  }
};

// Parse a JSON object into its top-level members; false when it is not one.
bool parse_obj(const std::string& s, JObj* out) {
  // ASCII only (what json.dumps writes): anything else is left to Python's decoder
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  JReader r{s.data(), s.data() + s.size()};
  r.ws();
  if (r.p >= r.end || *r.p++ != '{') return false;
  r.ws();
  if (r.p < r.end && *r.p == '}') return r.p++, r.ws(), r.p == r.end;
  for (;;) {
    std::string k;
    r.ws();
    if (!r.str(&k)) return false;
    r.ws();
    if (r.p >= r.end || *r.p++ != ':') return false;
    JVal v;
    if (!r.value(&v)) return false;
    (*out)[k] = std::move(v);
    r.ws();
    if (r.p < r.end && *r.p == ',') {
      r.p++;
      continue;
    }
    if (r.p >= r.end || *r.p++ != '}') return false;
    r.ws();
    return r.p == r.end;
  }
}

bool get_int(const JObj& o, const char* k, int64_t* v) {
  auto it = o.find(k);
  if (it == o.end() || it->second.type != 'i') return false;
  *v = it->second.i;
  return true;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o.push_back('\\'), o.push_back(char(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o.push_back(char(c));
    }
  }
  return o + "\"";
}
std::string err_json(const std::string& code, const std::string& msg) {
  return "{\"err\":" + json_str(code) + ",\"msg\":" + json_str(msg) + "}";
}

bool unhex(const std::string& h, std::string* out) {
  if (h.empty() || h.size() % 2 || h.size() > 128) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < h.size(); i += 2) {
    int a = nib(h[i]), b = nib(h[i + 1]);
    if (a < 0 || b < 0) return false;
    out->push_back(char(a << 4 | b));
  }
  return true;
}
std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) o.push_back(d[c >> 4]), o.push_back(d[c & 15]);
  return o;
}

std::string fwd_meta(int64_t chain, uint64_t chain_ver, const std::string& cid, uint64_t ver,
                     uint32_t crc) {
  std::string c = std::to_string(crc);
  return "{\"m\":\"fwd\",\"chain\":" + std::to_string(chain) + ",\"chain_ver\":" +
         std::to_string(chain_ver) + ",\"chunk\":\"" + hex(cid) + "\",\"ver\":" +
         std::to_string(ver) + ",\"offset\":0,\"truncate_to\":-1,\"crc\":" + c +
         ",\"full\":true,\"_pcrc\":" + c + "}";
}

std::string lock_key(int64_t tid, const std::string& cid) {  // storage.py: pack("<q", tid) + cid
  std::string k(8, '\0');
  for (int i = 0; i < 8; i++) k[i] = char(uint64_t(tid) >> (8 * i));
  return k + cid;
}

struct Held {
  LockTable& t;
  std::string k;
  Held(LockTable& table, std::string key) : t(table), k(std::move(key)) { t.acquire(k); }
  ~Held() { t.release(k); }
};

// The answer StorageNode.handle / rpc.Server give for an exception of the chunk engine.
std::string engine_error(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const IoError& e) {
    const char* name = strerrorname_np(e.err);
    return err_json(name ? name : "EIO", "[Errno " + std::to_string(e.err) + "] " + e.what());
  } catch (const ChecksumError& e) {
    return err_json("CHECKSUM", e.what());
  } catch (const VersionError& e) {
    return err_json("NEED_FULL", e.what());
  } catch (const std::invalid_argument& e) {
    return err_json("INTERNAL", std::string("ValueError: ") + e.what());
  } catch (const std::exception& e) {
    return err_json("INTERNAL", std::string("RuntimeError: ") + e.what());
  }
}

// Receive the successor's answer (kind 1, no payload) on c: 0 with *meta, or 2 with *err.
int recv_answer(Conn& c, std::string* meta, std::string* err) {
  uint8_t h[kHdr + kMac];
  size_t got;
  int e = recv_all(c.fd, h, sizeof h, &got);
  if (e < 0 || got < sizeof h) return *err = e < 0 ? errstr(-e) : "connection closed", 2;
  uint64_t mlen = get_be(h + 12, 4), dlen = get_be(h + 16, 4);
  if (h[0] != '3' || h[1] != 'F' || h[2] != 1 || h[3] != 1 || dlen || mlen > kMaxMeta ||
      get_be(h + 4, 8) != c.recv_seq)
    return *err = "unexpected answer frame", 2;
  meta->assign(mlen, '\0');
  e = recv_all(c.fd, &(*meta)[0], mlen, &got);
  if (e < 0 || got < mlen) return *err = e < 0 ? errstr(-e) : "truncated answer", 2;
  if (!mac_ok(c.key, h, *meta)) return *err = "bad frame MAC", 2;
  c.recv_seq++;
  return 0;
}

int set_timeouts(int fd, int sec) {
  timeval tv{sec, 0};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv))
    return -errno;
  return 0;
}

int connect_to(const std::string& addr, std::string* err) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos) return *err = "bad address " + addr, -1;
  std::string host = addr.substr(0, colon), port = addr.substr(colon + 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (int g = getaddrinfo(host.c_str(), port.c_str(), &hints, &res))
    return *err = std::string("getaddrinfo: ") + gai_strerror(g), -1;
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (r < 0 && errno == EINPROGRESS) {
      pollfd pf{fd, POLLOUT, 0};
      r = ::poll(&pf, 1, kConnectMs);
      int so = 0;
      socklen_t sl = sizeof so;
      if (r == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) && so == 0)
        r = 0;
      else
        errno = r == 0 ? ETIMEDOUT : (so ? so : errno), r = -1;
    }
    if (r == 0) break;
    *err = errstr(errno);
    ::close(fd), fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return -1;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1, sz = kSockBuf;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  return fd;
}
}  // namespace

bool json_members(const std::string& text, std::map<std::string, JsonMember>* out) {
  JObj o;
  if (!parse_obj(text, &o)) return false;
  for (auto& kv : o) (*out)[kv.first] = {kv.second.type, kv.second.type == 'b' ? kv.second.b : kv.second.i, kv.second.s};
  return true;
}

// --- AES-128-GMAC through libcrypto (dlopen) --------------------------------------------------
namespace {
struct Crypto {
  void* (*ctx_new)() = nullptr;
  void (*ctx_free)(void*) = nullptr;
  const void* (*aes_128_gcm)() = nullptr;
  int (*init)(void*, const void*, void*, const uint8_t*, const uint8_t*) = nullptr;
  int (*update)(void*, uint8_t*, int*, const uint8_t*, int) = nullptr;
  int (*final)(void*, uint8_t*, int*) = nullptr;
  int (*ctrl)(void*, int, int, void*) = nullptr;
  bool ok = false;
  Crypto() {
    void* h = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, name));
      return f != nullptr;
    };
    ok = sym(ctx_new, "EVP_CIPHER_CTX_new") && sym(ctx_free, "EVP_CIPHER_CTX_free") &&
         sym(aes_128_gcm, "EVP_aes_128_gcm") && sym(init, "EVP_EncryptInit_ex") &&
         sym(update, "EVP_EncryptUpdate") && sym(final, "EVP_EncryptFinal_ex") &&
         sym(ctrl, "EVP_CIPHER_CTX_ctrl");
  }
};
const Crypto& crypto() {
  static Crypto c;
  return c;
}
constexpr int kGcmSetIvLen = 0x9, kGcmGetTag = 0x10;  // EVP_CTRL_GCM_SET_IVLEN / _GET_TAG
}  // namespace

bool gmac_available() { return crypto().ok; }

bool gmac(const uint8_t key[16], const uint8_t nonce[12], const void* data, size_t len,
          uint8_t tag[16]) {
  const Crypto& c = crypto();
  if (!c.ok || len > size_t(1) << 30) return false;
  void* ctx = c.ctx_new();
  if (!ctx) return false;
  int n = 0;
  uint8_t none[16];
  bool ok = c.init(ctx, c.aes_128_gcm(), nullptr, nullptr, nullptr) == 1 &&
            c.ctrl(ctx, kGcmSetIvLen, 12, nullptr) == 1 &&
            c.init(ctx, nullptr, nullptr, key, nonce) == 1 &&
            (len == 0 || c.update(ctx, nullptr, &n, static_cast<const uint8_t*>(data), int(len)) == 1) &&
            c.final(ctx, none, &n) == 1 && c.ctrl(ctx, kGcmGetTag, 16, tag) == 1;
  c.ctx_free(ctx);
  return ok;
}

// --- LockTable ----------------------------------------------------------------------------------
void LockTable::acquire(const std::string& key) {
  Entry* e;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto& slot = locks_[key];
    if (!slot) slot = std::make_unique<Entry>();
    e = slot.get();
    e->refs++;
  }
  e->m.lock();
}

void LockTable::release(const std::string& key) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = locks_.find(key);
  if (it == locks_.end()) throw std::logic_error("release of a lock that is not held");
  it->second->m.unlock();
  if (--it->second->refs == 0) locks_.erase(it);
}

// --- FastPath -----------------------------------------------------------------------------------
FastPath::~FastPath() {
  for (auto& kv : pool_)
    for (auto& c : kv.second) ::close(c.fd);
}

void FastPath::set_chains(std::unordered_map<int64_t, ChainInfo> chains) {
  std::lock_guard<std::mutex> g(mu_);
  chains_ = std::move(chains);
}

bool FastPath::get_conn(const std::string& addr, Conn* c, std::string* err) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = pool_.find(addr);
    if (it != pool_.end() && !it->second.empty()) {
      *c = it->second.back();
      it->second.pop_back();
      return true;
    }
  }
  // rpc.client_handshake, offering no payload MAC flags: these connections only carry kind-3
  // forwards (payload covered by the CRC32C in the MACed meta) and their payload-less answers
  int fd = connect_to(addr, err);
  if (fd < 0) return false;
  auto fail = [&](const std::string& m) {
    ::close(fd);
    *err = m;
    return false;
  };
  if (set_timeouts(fd, kConnectMs / 1000)) return fail("setsockopt: " + errstr(errno));
  uint8_t hello[21] = {'3', 'F', 'S', 'H', 0}, r[53];
  if (getrandom(hello + 5, 16, 0) != 16) return fail("getrandom failed");
  if (::send(fd, hello, sizeof hello, MSG_NOSIGNAL) != ssize_t(sizeof hello))
    return fail("handshake send failed");
  size_t got;
  if (recv_all(fd, r, sizeof r, &got) < 0 || got < sizeof r)
    return fail("server closed the connection during the handshake");
  if (std::memcmp(r, "3FSH", 4) || r[4] != 0) return fail("server sent a bad hello");
  // t = offered flags + chosen flags + client nonce + server nonce; proofs HMAC(secret, label + t)
  uint8_t tag[3 + 34], proof[32];
  tag[3] = 0, tag[4] = r[4];
  std::memcpy(tag + 5, hello + 5, 16);
  std::memcpy(tag + 21, r + 5, 16);
  auto secret = reinterpret_cast<const uint8_t*>(secret_.data());
  std::memcpy(tag, "srv", 3);
  hmac_sha256(secret, secret_.size(), {{tag, 37}}, proof);
  if (std::memcmp(proof, r + 21, 32)) return fail("server does not know the cluster secret");
  std::memcpy(tag, "cli", 3);
  hmac_sha256(secret, secret_.size(), {{tag, 37}}, proof);
  if (::send(fd, proof, 32, MSG_NOSIGNAL) != 32) return fail("handshake send failed");
  std::memcpy(tag, "key", 3);
  hmac_sha256(secret, secret_.size(), {{tag, 37}}, c->key);
  if (set_timeouts(fd, kIoSec)) return fail("setsockopt: " + errstr(errno));
  c->fd = fd, c->send_seq = c->recv_seq = 0;
  return true;
}

void FastPath::put_conn(const std::string& addr, Conn c) {
  std::lock_guard<std::mutex> g(mu_);
  auto& v = pool_[addr];
  if (v.size() < 16)
    v.push_back(c);
  else
    ::close(c.fd);
}

template <class F>
int FastPath::forward_around(const std::string& addr, const std::string& fwd, const char* data,
                             size_t len, F&& local, std::string* err) {
  Conn c;
  if (!get_conn(addr, &c, err)) return 2;
  if (int e = send_frame(c.fd, c.key, &c.send_seq, 3, fwd, data, len)) {
    ::close(c.fd);
    return *err = errstr(-e), 2;
  }
  try {
    local();  // the successor works on its copy meanwhile
  } catch (...) {
    ::close(c.fd);  // the answer is dropped with the connection (as Pending.cancel)
    throw;
  }
  std::string ans;
  JObj o;
  if (recv_answer(c, &ans, err)) return ::close(c.fd), 2;
  if (!parse_obj(ans, &o)) return ::close(c.fd), *err = "answer meta is not a JSON object", 2;
  put_conn(addr, c);
  if (o.count("err")) return *err = std::move(ans), 1;
  return 0;
}

namespace {
// The space of a chunk's new pending version taken before the write is forwarded (ChunkEngine::reserve: a write this
// target cannot hold fails before a successor applies it), and what the local update did not use given back
struct Reserved {
  ChunkEngine* e;
  const std::string& id;
  Reserved(ChunkEngine* eng, const std::string& cid, uint64_t n) : e(eng), id(cid) { e->reserve(id, n); }
  ~Reserved() { e->unreserve(id); }
};

// A successor's refusal that no retry changes: the version is dropped on the way back up the chain
bool refused_for_good(const std::string& code) { return code == "ENOSPC" || code == "EINVAL" || code == "EFBIG"; }
}  // namespace

int FastPath::head_write(int64_t tid, int64_t chain, uint64_t chain_ver, const std::string& cid,
                         uint64_t ver, const char* data, size_t len, uint32_t crc,
                         const uint32_t* blocks, const std::string& succ_addr, std::string* err) {
  ChunkEngine* eng = engines_.at(tid);
  Reserved r(eng, cid, len);
  return forward_around(succ_addr, fwd_meta(chain, chain_ver, cid, ver, crc), data, len, [&] {
    eng->update(cid, ver, chain_ver, 0, data, len, -1, false, blocks, crc);
  }, err);
}

// The answer of a request handled here (counted), as a kind-1 frame. 1: sent, -errno: not sent.
int FastPath::send_answer(int fd, const uint8_t key[32], uint64_t* send_seq, const std::string& answer) {
  handled_++;
  int e = send_frame(fd, key, send_seq, 1, answer, nullptr, 0);
  return e ? e : 1;
}

// 1: handled (answer sent), 0: not an ordinary full-chunk forward (Python takes the frame),
// -errno: the answer could not be sent.
int FastPath::try_fwd(int fd, const uint8_t key[32], const uint8_t* hdr, const std::string& meta,
                      const char* data, size_t len, uint64_t* recv_seq, uint64_t* send_seq) {
  if (!mac_ok(key, hdr, meta)) return 0;
  JObj o;
  if (!parse_obj(meta, &o)) return 0;
  auto m = o.find("m"), full = o.find("full"), chunk = o.find("chunk");
  int64_t chain, cv, ver, crc, off, trunc, pcrc;
  if (m == o.end() || m->second.type != 's' || m->second.s != "fwd" || full == o.end() ||
      full->second.type != 'b' || !full->second.b || chunk == o.end() ||
      chunk->second.type != 's' || !get_int(o, "chain", &chain) ||
      !get_int(o, "chain_ver", &cv) || !get_int(o, "ver", &ver) || !get_int(o, "crc", &crc) ||
      !get_int(o, "offset", &off) || !get_int(o, "truncate_to", &trunc) ||
      !get_int(o, "_pcrc", &pcrc) || ver < 1 || crc < 0 || crc >> 32 || off != 0 || trunc != -1)
    return 0;
  std::string cid;
  if (!unhex(chunk->second.s, &cid)) return 0;
  ChainInfo ci;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = chains_.find(chain);
    if (it == chains_.end()) return 0;
    ci = it->second;
  }
  if (ci.ver != uint64_t(cv) || ci.tid < 0 || !ci.writes) return 0;
  auto ei = engines_.find(ci.tid);
  if (ei == engines_.end() || len > ei->second->max_chunk_size()) return 0;
  ChunkEngine* eng = ei->second;
  std::vector<uint32_t> blocks((len + kBlockBytes - 1) / kBlockBytes);
  if (crc32c_blocks(data, len, blocks.data()) != uint64_t(pcrc)) return 0;  // Python rejects it
  ++*recv_seq;  // the frame is accepted

  // StorageNode._fwd: forward first, write the pending version meanwhile, then the ack; commit
  std::string answer;
  try {
    Held h(locks_, lock_key(ci.tid, cid));
    auto apply = [&] {  // StorageNode._apply(full=True)
      auto cur = eng->meta(cid);
      ChunkMeta mm = cur ? *cur : ChunkMeta{};
      uint64_t latest = mm.pending_ver ? mm.pending_ver : mm.committed_ver;
      uint32_t latest_crc = mm.pending_ver ? mm.pending_crc : mm.crc;
      if (latest == uint64_t(ver) && latest_crc == uint32_t(crc)) return;  // a retried forward
      ChunkMeta nm = eng->update(cid, ver, cv, 0, data, len, -1, true, blocks.data(), pcrc);
      if (nm.pending_crc != uint32_t(crc)) {
        eng->abort(cid, ver);
        throw ChecksumError("full-chunk payload does not match its CRC32C");
      }
    };
    int st = 0;
    std::string err;
    if (ci.succ_addr.empty()) {
      apply();
    } else {
      Reserved r(eng, cid, len);
      st = forward_around(ci.succ_addr, fwd_meta(chain, cv, cid, ver, uint32_t(crc)), data, len,
                          apply, &err);
    }
    if (st == 2) {
      answer = err_json("RETRY", "successor unreachable: " + err);
    } else if (st == 1) {
      JObj a;
      parse_obj(err, &a);
      if (refused_for_good(a["err"].s)) eng->abort(cid, ver);
      answer = std::move(err);  // the successor's error, passed up unchanged
    } else {
      auto cur = eng->meta(cid);
      if (cur && cur->pending_ver == uint64_t(ver)) eng->commit(cid, ver);
      answer = "{\"ver\":" + std::to_string(ver) + "}";
    }
  } catch (...) {
    answer = engine_error(std::current_exception());
  }
  return send_answer(fd, key, send_seq, answer);
}

// StorageNode._write for a full-chunk write with a successor. 1: handled, 0: Python takes the
// frame (checked again there), -errno: the answer could not be sent.
int FastPath::try_write(int fd, const uint8_t key[32], const uint8_t gkey[16], const uint8_t* hdr,
                        const std::string& meta, const char* data, size_t len,
                        uint64_t* recv_seq, uint64_t* send_seq) {
  // frame MAC: HMAC(key, header + meta + GMAC tag of the payload), the nonce kind + sequence
  uint8_t nonce[12] = {0}, tag[16], m[32];
  std::memcpy(nonce, hdr + 3, 9);
  if (!gmac(gkey, nonce, data, len, tag)) return 0;
  hmac_sha256(key, 32, {{hdr, kHdr}, {meta.data(), meta.size()}, {tag, 16}}, m);
  uint8_t d = 0;
  for (size_t i = 0; i < kMac; i++) d |= m[i] ^ hdr[kHdr + i];
  if (d) return 0;
  JObj o;
  if (!parse_obj(meta, &o)) return 0;
  auto mm = o.find("m"), chunk = o.find("chunk");
  int64_t chain, cv, off = 0, trunc = -1;
  if (mm == o.end() || mm->second.type != 's' || mm->second.s != "write" || chunk == o.end() ||
      chunk->second.type != 's' || !get_int(o, "chain", &chain) || !get_int(o, "chain_ver", &cv))
    return 0;
  if ((o.count("offset") && !get_int(o, "offset", &off)) ||
      (o.count("truncate_to") && !get_int(o, "truncate_to", &trunc)) || off != 0 || trunc >= 0)
    return 0;
  std::string cid;
  if (!unhex(chunk->second.s, &cid) || cid.size() > 64) return 0;
  ChainInfo ci;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = chains_.find(chain);
    if (it == chains_.end()) return 0;
    ci = it->second;
  }
  if (ci.ver != uint64_t(cv) || ci.tid < 0 || !ci.writes || !ci.head || ci.succ_addr.empty())
    return 0;
  auto ei = engines_.find(ci.tid);
  if (ei == engines_.end() || len > ei->second->max_chunk_size()) return 0;
  ChunkEngine* eng = ei->second;

  std::string answer;
  {
    Held h(locks_, lock_key(ci.tid, cid));
    ChunkMeta cur;
    try {
      auto mo = eng->meta(cid);
      if (mo) cur = *mo;
    } catch (...) {
      return 0;
    }
    uint64_t latest = cur.pending_ver ? cur.pending_ver : cur.committed_ver;
    uint64_t base = cur.pending_ver ? cur.pending_size : cur.size;
    if (len < base) return 0;  // not the whole chunk: Python's partial-write path
    ++*recv_seq;               // the frame is accepted
    uint64_t ver = latest + 1;
    std::vector<uint32_t> blocks((len + kBlockBytes - 1) / kBlockBytes);
    uint32_t crc = crc32c_blocks(data, len, blocks.data());
    try {
      std::string err;
      Reserved r(eng, cid, len);
      int st = forward_around(ci.succ_addr, fwd_meta(chain, cv, cid, ver, crc), data, len, [&] {
        eng->update(cid, ver, cv, 0, data, len, -1, false, blocks.data(), crc);
      }, &err);
      if (st == 2) {
        answer = err_json("RETRY", "successor unreachable: rpc fwd to " + ci.succ_addr +
                                       " failed: " + err);
      } else if (st == 1) {
        JObj a;
        parse_obj(err, &a);
        if (refused_for_good(a["err"].s)) eng->abort(cid, ver);
        answer = std::move(err);
      } else {
        eng->commit(cid, ver);
        answer = "{\"ver\":" + std::to_string(ver) + "}";
      }
    } catch (...) {
      answer = engine_error(std::current_exception());
    }
  }
  return send_answer(fd, key, send_seq, answer);
}

int FastPath::serve(int fd, const uint8_t key[32], int flags, uint64_t* recv_seq,
                    uint64_t* send_seq, char* buf, size_t buf_len, RawFrame* out,
                    std::string* err) {
  uint8_t gkey[32];  // rpc._gmac_for: AES key HMAC(session key, "gmac")[:16]
  hmac_sha256(key, 32, {{"gmac", 4}}, gkey);
  bool gmac_ok = flags == 2 && gmac_available();
  for (;;) {
    uint8_t h[kHdr + kMac];
    size_t got;
    int e = recv_all(fd, h, sizeof h, &got);
    if (e < 0) return *err = errstr(-e), 3;
    if (got == 0) return 1;
    auto truncated = [&](size_t n) {
      *err = "connection closed after " + std::to_string(got) + " of " + std::to_string(n) +
             " bytes (truncated frame)";
      return 2;
    };
    if (got < sizeof h) return truncated(sizeof h);
    // the checks of rpc.Channel.recv(0), in its order
    uint64_t mlen = get_be(h + 12, 4), dlen = get_be(h + 16, 4), seq = get_be(h + 4, 8);
    if (h[0] != '3' || h[1] != 'F' || h[2] != 1) return *err = "bad magic/version", 2;
    if (h[3] != 0 && h[3] != 3) return *err = "unexpected frame kind " + std::to_string(h[3]), 2;
    if (mlen > kMaxMeta || dlen > kMaxData) return *err = "frame too large", 2;
    if (seq != *recv_seq) return *err = "sequence number " + std::to_string(seq), 2;
    std::string meta(mlen, '\0');
    if ((e = recv_all(fd, &meta[0], mlen, &got)) < 0) return *err = errstr(-e), 3;
    if (got < mlen) return truncated(mlen);
    bool have = dlen <= buf_len;
    if (have && dlen) {
      if ((e = recv_all(fd, buf, dlen, &got)) < 0) return *err = errstr(-e), 3;
      if (got < dlen) return truncated(dlen);
    }
    if (h[3] == 3 && have && dlen) {
      int r = try_fwd(fd, key, h, meta, buf, dlen, recv_seq, send_seq);
      if (r == 1) continue;
      if (r < 0) return *err = errstr(-r), 3;
    }
    if (h[3] == 0 && have && dlen && gmac_ok) {
      int r = try_write(fd, key, gkey, h, meta, buf, dlen, recv_seq, send_seq);
      if (r == 1) continue;
      if (r < 0) return *err = errstr(-r), 3;
    }
    out->hdr.assign(reinterpret_cast<char*>(h), sizeof h);
    out->meta = std::move(meta);
    out->have_data = have;
    return 0;
  }
}

}  // namespace threefs
