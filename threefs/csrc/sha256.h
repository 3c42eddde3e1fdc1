// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104) for the RPC frame MACs of the C++ data path
// (fastpath.cpp); the inputs there are small (a frame header and its JSON meta).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

namespace threefs {
using Part = std::pair<const void*, size_t>;
// out = HMAC-SHA256(key, concatenation of parts)
void hmac_sha256(const uint8_t* key, size_t key_len, std::initializer_list<Part> parts,
                 uint8_t out[32]);
}  // namespace threefs
