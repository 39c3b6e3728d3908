#include "common/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <sys/random.h>

#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace idemsaga::common {
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

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest,
           &n) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(digest), n);
}

std::string Hex(std::string_view bytes) {
  return ToHex(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Hash first so the comparison is over equal lengths and leaks no length either.
  std::string ha = Sha256Hex(a), hb = Sha256Hex(b);
  return CRYPTO_memcmp(ha.data(), hb.data(), ha.size()) == 0;
}

// The kernel's CSPRNG, not RAND_bytes: OpenSSL 3 takes locks and looks up its generator on
// every call, and a charge or reservation id per order made RAND_bytes 3% of a busy stack's
// CPU. getrandom(2) is as unpredictable and a single cheap system call.
std::string RandomHex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  for (size_t got = 0; got < bytes;) {
    ssize_t n = getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "getrandom");
    }
    got += static_cast<size_t>(n);
  }
  return ToHex(buf.data(), bytes);
}

}  // namespace idemsaga::common
