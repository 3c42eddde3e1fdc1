// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used for chunk checksums.
#pragma once
#include <cstddef>
#include <cstdint>

namespace threefs {
// Continue a CRC32C over `len` bytes; start with crc = 0. Uses SSE4.2 when the CPU has it.
uint32_t crc32c(uint32_t crc, const void* data, size_t len);
bool crc32c_hardware();
// CRC32C of `len` bytes and, in the same pass, of each kBlockBytes block of them (the last one
// may be shorter) into block_crcs[ceil(len / kBlockBytes)].
constexpr size_t kBlockBytes = 4096;
uint32_t crc32c_blocks(const void* data, size_t len, uint32_t* block_crcs);
}  // namespace threefs
