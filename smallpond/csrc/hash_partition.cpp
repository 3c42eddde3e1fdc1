// Stable hashing: the result depends only on the key values (read little-endian), never on the
// machine, process, or Arrow chunking, so equal keys land in the same partition everywhere.
#include "hash_partition.h"

#include <cstring>
#include <stdexcept>

namespace smallpond {
namespace {

constexpr uint64_t kSeed = 0x2545F4914F6CDD1DULL;
constexpr uint64_t kNull = 0x6E756C6C6E756C6CULL;  // "nullnull"
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMul1 = 0x87C37B91114253D5ULL;
constexpr uint64_t kMul2 = 0x4CF5AD432745937FULL;

inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xFF51AFD7ED558CCDULL;
  k ^= k >> 33;
  k *= 0xC4CEB9FE1A85EC53ULL;
  k ^= k >> 33;
  return k;
}

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t load_le(const uint8_t* p, int n) {  // n <= 8 bytes, little-endian
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

inline uint64_t load8(const uint8_t* p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
#else
  return load_le(p, 8);
#endif
}

// Hash of a byte string (see ref.py: hash_bytes).
inline uint64_t hash_bytes(const uint8_t* p, int64_t len) {
  uint64_t h = static_cast<uint64_t>(len) * kMul1;
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    h ^= fmix64(load8(p + i) * kMul2);
    h = rotl(h, 27) * kMul1 + kGolden;
  }
  int tail = static_cast<int>(len - i);
  if (tail > 0) h ^= fmix64(load_le(p + i, tail) * kMul2 ^ static_cast<uint64_t>(tail));
  return fmix64(h);
}

inline uint64_t hash_u64(uint64_t x) { return fmix64(x ^ kGolden); }

inline uint64_t combine(uint64_t h, uint64_t v) {
  return fmix64(h ^ (v + kGolden + (h << 6) + (h >> 2)));
}

inline bool is_valid(const uint8_t* bitmap, int64_t i) {
  return bitmap == nullptr || ((bitmap[i >> 3] >> (i & 7)) & 1);
}

inline int64_t load_int(const uint8_t* p, int width) {
  switch (width) {
    case 1: { int8_t v; std::memcpy(&v, p, 1); return v; }
    case 2: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case 4: { int32_t v; std::memcpy(&v, p, 4); return v; }
    default: { int64_t v; std::memcpy(&v, p, 8); return v; }
  }
}

inline uint64_t load_uint(const uint8_t* p, int width) {
  switch (width) {
    case 1: return p[0];
    case 2: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    default: { uint64_t v; std::memcpy(&v, p, 8); return v; }
  }
}

inline uint64_t float_bits(const uint8_t* p, int width) {
  double d;
  if (width == 4) { float f; std::memcpy(&f, p, 4); d = f; } else { std::memcpy(&d, p, 8); }
  if (d == 0.0) d = 0.0;                       // -0.0 == 0.0
  if (d != d) return 0x7FF8000000000000ULL;    // canonical NaN
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  return bits;
}

template <typename F>
void fold_column(const Column& c, int64_t nrows, uint64_t* out, F value_hash) {
  for (int64_t r = 0; r < nrows; ++r) {
    int64_t i = r + c.offset;
    uint64_t v = is_valid(c.validity, i) ? value_hash(i) : kNull;
    out[r] = combine(out[r], v);
  }
}

}  // namespace

void hash_rows(const std::vector<Column>& cols, int64_t nrows, uint64_t* out) {
  for (int64_t r = 0; r < nrows; ++r) out[r] = kSeed;
  for (const Column& c : cols) {
    const int w = c.width;
    switch (c.kind) {
      case ColKind::Int:
        fold_column(c, nrows, out, [&](int64_t i) {
          return hash_u64(static_cast<uint64_t>(load_int(c.data + i * w, w)));
        });
        break;
      case ColKind::UInt:
        fold_column(c, nrows, out, [&](int64_t i) { return hash_u64(load_uint(c.data + i * w, w)); });
        break;
      case ColKind::Float:
        fold_column(c, nrows, out, [&](int64_t i) { return hash_u64(float_bits(c.data + i * w, w)); });
        break;
      case ColKind::Binary: {
        const int32_t* off = reinterpret_cast<const int32_t*>(c.offsets);
        fold_column(c, nrows, out, [&](int64_t i) {
          return hash_bytes(c.data + off[i], static_cast<int64_t>(off[i + 1]) - off[i]);
        });
        break;
      }
      case ColKind::LargeBinary: {
        const int64_t* off = reinterpret_cast<const int64_t*>(c.offsets);
        fold_column(c, nrows, out,
                    [&](int64_t i) { return hash_bytes(c.data + off[i], off[i + 1] - off[i]); });
        break;
      }
      case ColKind::FixedBinary:
        fold_column(c, nrows, out, [&](int64_t i) { return hash_bytes(c.data + i * w, w); });
        break;
      default:
        throw std::invalid_argument("unknown column kind");
    }
  }
}

void group_by_bucket(const uint32_t* buckets, int64_t nrows, uint32_t n, int64_t* indices,
                     int64_t* offsets) {
  std::vector<int64_t> count(static_cast<size_t>(n) + 1, 0);
  for (int64_t r = 0; r < nrows; ++r) ++count[buckets[r] + 1];
  for (uint32_t b = 0; b < n; ++b) count[b + 1] += count[b];
  for (uint32_t b = 0; b <= n; ++b) offsets[b] = count[b];
  for (int64_t r = 0; r < nrows; ++r) indices[count[buckets[r]]++] = r;
}

}  // namespace smallpond
