#include "common/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <stdexcept>
#include <vector>

namespace common {
namespace {

std::string ToHex(const unsigned char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return ToHex(digest, sizeof digest);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Hash first so the comparison is over equal lengths and leaks no length either.
  std::string ha = Sha256Hex(a), hb = Sha256Hex(b);
  return CRYPTO_memcmp(ha.data(), hb.data(), ha.size()) == 0;
}

std::string RandomHex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  if (RAND_bytes(buf.data(), static_cast<int>(bytes)) != 1) {
    throw std::runtime_error("RAND_bytes failed");
  }
  return ToHex(buf.data(), bytes);
}

}  // namespace common
