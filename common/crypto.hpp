// Small cryptographic helpers on top of OpenSSL's libcrypto. Thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace idemsaga::common {

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

// HMAC-SHA256 of `data` under `key`: the 32 raw bytes (SigV4 chains them as the next key).
std::string HmacSha256(std::string_view key, std::string_view data);

// Lower-case hex of raw bytes.
std::string Hex(std::string_view bytes);

// Compares secrets without leaking where they first differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// `bytes` random bytes from the OS CSPRNG, as lower-case hex.
std::string RandomHex(size_t bytes);

}  // namespace idemsaga::common
