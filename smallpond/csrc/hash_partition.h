// Stable row hashing and hash partitioning over Arrow column buffers.
// Nothing here depends on libarrow: columns arrive as raw buffers (validity bitmap, values,
// offsets) exactly as laid out by the Arrow columnar format.
#pragma once
#include <cstdint>
#include <vector>

namespace smallpond {

// Kind of a key column, as seen by the hasher.
enum class ColKind : int {
  Int = 0,      // signed integer, width 1/2/4/8 bytes; widened to int64 before hashing
  UInt = 1,     // unsigned integer, width 1/2/4/8 bytes; widened to uint64
  Float = 2,    // IEEE float, width 4/8; widened to double, -0.0 -> 0.0, all NaNs equal
  Binary = 3,   // variable-width bytes with int32 offsets (string, binary)
  LargeBinary = 4,  // variable-width bytes with int64 offsets (large_string, large_binary)
  FixedBinary = 5,  // fixed-width bytes of `width` bytes (fixed_size_binary, decimal)
};

struct Column {
  ColKind kind;
  int width;                // bytes per value for fixed-width kinds
  int64_t offset;           // Arrow array offset (in elements)
  const uint8_t* validity;  // may be null: all valid
  const uint8_t* data;      // values (or bytes for Binary kinds)
  const uint8_t* offsets;   // int32/int64 offsets for Binary kinds, else null
};

// Combine the hashes of all key columns of rows [0, nrows) into out[nrows].
void hash_rows(const std::vector<Column>& cols, int64_t nrows, uint64_t* out);

// Map a 64-bit hash onto [0, n) (multiply-shift; uniform, no modulo bias).
inline uint32_t bucket_of(uint64_t h, uint32_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

// Stable counting sort of rows by bucket: fills indices[nrows] (row ids grouped by bucket, in
// their original order within a bucket) and offsets[n + 1].
void group_by_bucket(const uint32_t* buckets, int64_t nrows, uint32_t n, int64_t* indices,
                     int64_t* offsets);

}  // namespace smallpond
