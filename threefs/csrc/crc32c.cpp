#include "crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace threefs {
namespace {

struct Table {
  uint32_t t[8][256];
  Table() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
      for (int s = 1; s < 8; s++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
const Table& table() {
  static const Table tb;
  return tb;
}

// Slicing-by-8 software path.
uint32_t crc_sw(uint32_t crc, const uint8_t* p, size_t n) {
  const Table& tb = table();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = tb.t[7][w & 0xFF] ^ tb.t[6][(w >> 8) & 0xFF] ^ tb.t[5][(w >> 16) & 0xFF] ^
          tb.t[4][(w >> 24) & 0xFF] ^ tb.t[3][(w >> 32) & 0xFF] ^ tb.t[2][(w >> 40) & 0xFF] ^
          tb.t[1][(w >> 48) & 0xFF] ^ tb.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ tb.t[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw_serial(uint32_t crc, const uint8_t* p,
                                                         size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

// Folding with carry-less multiplication (AVX-512 VPCLMULQDQ), for CPUs that have it: four
// 64-byte accumulators advance over 256 bytes per step. A 128-bit lane A moved forward by D bits
// keeps its CRC residue as clmul(A.lo64, K(D + 32)) ^ clmul(A.hi64, K(D - 32)), with
// K(e) = bit-reflected (x^e mod P) shifted left by one (P the CRC32C polynomial; the constants
// below were derived that way and checked against the bitwise CRC). The last accumulator, whose
// 64 bytes have the same residue as all the data folded into it, is finished with crc32.
bool have_fold() {
  static const bool h = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("vpclmulqdq");
  return h;
}

__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) inline __m512i fold(__m512i a, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(a, k, 0x00),
                          _mm512_clmulepi64_epi128(a, k, 0x11));
}

// Raw CRC register over n >= 256 bytes.
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) uint32_t crc_fold(uint32_t crc,
                                                                       const uint8_t* p,
                                                                       size_t n) {
  const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(0xb9e02b86, 0xdcb17aa4));
  const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x9e4addf8, 0x740eef02));
  __m512i a0 = _mm512_loadu_si512(p), a1 = _mm512_loadu_si512(p + 64),
          a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
  a0 = _mm512_xor_si512(a0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  p += 256;
  n -= 256;
  while (n >= 256) {
    a0 = _mm512_xor_si512(fold(a0, k2048), _mm512_loadu_si512(p));
    a1 = _mm512_xor_si512(fold(a1, k2048), _mm512_loadu_si512(p + 64));
    a2 = _mm512_xor_si512(fold(a2, k2048), _mm512_loadu_si512(p + 128));
    a3 = _mm512_xor_si512(fold(a3, k2048), _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  a1 = _mm512_xor_si512(a1, fold(a0, k512));
  a2 = _mm512_xor_si512(a2, fold(a1, k512));
  a3 = _mm512_xor_si512(a3, fold(a2, k512));
  alignas(64) uint8_t last[64];
  _mm512_store_si512(reinterpret_cast<__m512i*>(last), a3);
  return crc_hw_serial(crc_hw_serial(0, last, 64), p, n);
}

// The crc32 instruction has a 3-cycle latency but a 1-cycle throughput, so three independent
// streams over consecutive stripes of kStripe bytes run about three times faster; the stripes'
// registers are then joined with shift(r) = crc(r, kStripe zero bytes), which is linear in r
// and is applied with four 256-entry tables.
constexpr size_t kStripe = 4096;

struct Shift {
  uint32_t t[4][256];
  Shift() {
    static uint8_t zeros[kStripe];
    uint32_t basis[32];
    for (int i = 0; i < 32; i++) basis[i] = crc_hw_serial(1u << i, zeros, kStripe);
    for (int k = 0; k < 4; k++)
      for (int b = 0; b < 256; b++) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; bit++)
          if (b >> bit & 1) v ^= basis[8 * k + bit];
        t[k][b] = v;
      }
  }
  uint32_t operator()(uint32_t r) const {
    return t[0][r & 0xFF] ^ t[1][(r >> 8) & 0xFF] ^ t[2][(r >> 16) & 0xFF] ^ t[3][r >> 24];
  }
};

// Three independent crc32 streams over the three stripes at p, from registers a, b and c.
__attribute__((target("sse4.2"))) inline void crc_3stripes(const uint8_t* p, uint64_t& a, uint64_t& b,
                                                          uint64_t& c) {
  for (size_t i = 0; i < kStripe; i += 8) {
    uint64_t wa, wb, wc;
    std::memcpy(&wa, p + i, 8);
    std::memcpy(&wb, p + kStripe + i, 8);
    std::memcpy(&wc, p + 2 * kStripe + i, 8);
    a = __builtin_ia32_crc32di(a, wa);
    b = __builtin_ia32_crc32di(b, wb);
    c = __builtin_ia32_crc32di(c, wc);
  }
}

__attribute__((target("sse4.2"))) uint32_t crc_hw(uint32_t crc, const uint8_t* p, size_t n) {
  if (n >= 256 && have_fold()) return crc_fold(crc, p, n);
  static const Shift shift;
  while (n >= 3 * kStripe) {
    uint64_t a = crc, b = 0, c = 0;
    crc_3stripes(p, a, b, c);
    uint32_t r = shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b);
    crc = shift(r) ^ static_cast<uint32_t>(c);
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  return crc_hw_serial(crc, p, n);
}
bool have_hw() {
  static const bool h = __builtin_cpu_supports("sse4.2");
  return h;
}


// One pass over whole kStripe blocks: three blocks at a time, each CRC'd from ~0 as its own
// checksum, while the whole buffer's register advances block by block:
//   raw(R, B) = shift(R) ^ raw(0, B) and a = raw(~0, B) = shift(~0) ^ raw(0, B)
//   => raw(R, B) = shift(R ^ ~0) ^ a   (shift is linear).
__attribute__((target("sse4.2"))) uint32_t crc_blocks_hw(const uint8_t* p, size_t n,
                                                         uint32_t* out) {
  static const Shift shift;
  uint32_t R = ~0u;
  while (n >= kStripe && have_fold()) {
    uint32_t ra = crc_fold(~0u, p, kStripe);
    *out++ = ~ra;
    R = shift(R ^ ~0u) ^ ra;
    p += kStripe;
    n -= kStripe;
  }
  while (n >= 3 * kStripe) {
    uint64_t a = ~0u, b = ~0u, c = ~0u;
    crc_3stripes(p, a, b, c);
    uint32_t ra = static_cast<uint32_t>(a), rb = static_cast<uint32_t>(b),
             rc = static_cast<uint32_t>(c);
    *out++ = ~ra;
    *out++ = ~rb;
    *out++ = ~rc;
    R = shift(R ^ ~0u) ^ ra;
    R = shift(R ^ ~0u) ^ rb;
    R = shift(R ^ ~0u) ^ rc;
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  while (n >= kStripe) {
    uint32_t ra = crc_hw_serial(~0u, p, kStripe);
    *out++ = ~ra;
    R = shift(R ^ ~0u) ^ ra;
    p += kStripe;
    n -= kStripe;
  }
  if (n) {
    *out = ~crc_hw_serial(~0u, p, n);
    R = crc_hw_serial(R, p, n);
  }
  return ~R;
}
#else
uint32_t crc_hw(uint32_t crc, const uint8_t* p, size_t n) { return crc_sw(crc, p, n); }
bool have_hw() { return false; }
#endif
}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  crc = have_hw() ? crc_hw(crc, p, len) : crc_sw(crc, p, len);
  return ~crc;
}

bool crc32c_hardware() { return have_hw(); }

uint32_t crc32c_blocks(const void* data, size_t len, uint32_t* block_crcs) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  if (have_hw()) return crc_blocks_hw(p, len, block_crcs);
#endif
  for (size_t off = 0; off < len; off += kBlockBytes)
    *block_crcs++ = crc32c(0, p + off, len - off < kBlockBytes ? len - off : kBlockBytes);
  return crc32c(0, p, len);
}
}  // namespace threefs
