#include "common/trace/trace_context.hpp"

#include <openssl/rand.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <stdexcept>

namespace idemsaga::common::trace {
namespace {

// Ids must be unique, not secret (W3C Trace Context: "randomly generated"): a per-thread
// xoshiro256** seeded from OpenSSL costs nanoseconds, where a RAND_bytes call per span went
// through OpenSSL's locked DRBG, 4% of the server's CPU under order load.
class IdSource {
 public:
  IdSource() {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(s_.data()), sizeof(s_)) != 1) {
      throw std::runtime_error("RAND_bytes failed");
    }
    if ((s_[0] | s_[1] | s_[2] | s_[3]) == 0) s_[0] = 1;  // the one state it never leaves
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> s_{};
};

// `words` random 64-bit words as hex, never all zeros (an invalid id).
std::string NewId(int words) {
  thread_local IdSource source;
  static constexpr char kHex[] = "0123456789abcdef";
  std::array<uint64_t, 2> w{};
  do {
    for (int i = 0; i < words; ++i) w[i] = source.Next();
  } while ((w[0] | w[1]) == 0);
  std::string out(static_cast<size_t>(words) * 16, '0');
  for (int i = 0; i < words; ++i) {
    for (int d = 0; d < 16; ++d) out[i * 16 + d] = kHex[(w[i] >> (60 - 4 * d)) & 0xf];
  }
  return out;
}

}  // namespace

bool IsHexId(std::string_view s, size_t length) {
  if (s.size() != length) return false;
  bool nonzero = false;
  for (char c : s) {
    bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    if (!hex) return false;
    nonzero = nonzero || c != '0';
  }
  return nonzero;
}

std::optional<TraceParent> ParseTraceparent(std::string_view h) {
  // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 characters.
  if (h.size() < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  std::string_view version = h.substr(0, 2);
  auto is_hex2 = [](std::string_view v) {
    for (char c : v) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
  };
  if (!is_hex2(version) || version == "ff") return std::nullopt;
  // Version 00 is exactly 55 characters; a later version may append fields after a '-'.
  if (version == "00" ? h.size() != 55 : (h.size() > 55 && h[55] != '-')) return std::nullopt;
  std::string_view flags = h.substr(53, 2);
  if (!is_hex2(flags)) return std::nullopt;
  TraceParent tp{std::string(h.substr(3, 32)), std::string(h.substr(36, 16)), false};
  if (!IsHexId(tp.trace_id, 32) || !IsHexId(tp.parent_id, 16)) return std::nullopt;
  tp.sampled = (std::stoi(std::string(flags), nullptr, 16) & 1) != 0;
  return tp;
}

std::string FormatTraceparent(std::string_view trace_id, std::string_view span_id, bool sampled) {
  return "00-" + std::string(trace_id) + "-" + std::string(span_id) + (sampled ? "-01" : "-00");
}

// The first 8 hex digits are the seconds since the epoch, as AWS X-Ray's trace ids have them;
// the other 24 (12 bytes, W3C's "random" part and more) are random. Stores index trace ids:
// ids of one second land beside each other, so a table of millions takes its inserts on a few
// hot index pages instead of a random one each (a page read, and a full-page image in the WAL
// after every checkpoint).
std::string NewTraceId() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = NewId(2);
  auto seconds = static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count());
  for (int d = 0; d < 8; ++d) id[d] = kHex[(seconds >> (28 - 4 * d)) & 0xf];
  return id;
}
std::string NewSpanId() { return NewId(1); }

}  // namespace idemsaga::common::trace
