// When a span is an error (common/trace/span_status.hpp): the rule over a table of statuses,
// and what ending a span records.
#include "common/trace/span_status.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "common/trace/exporter.hpp"

namespace {

using namespace idemsaga::common::trace;

// The one rule for request spans (common/trace/span_status.hpp), over every status an edge of
// ours answers: an error when the server failed or the request itself was refused; never for a
// stored business outcome, nor for a well-formed request told to come back.
TEST(SpanStatusRule, ARequestSpanIsAnErrorWhenTheServerFailedOrTheRequestWasRefused) {
  using End = RequestEnd;
  struct Row {
    int status;
    bool stored;
    End end;
  };
  const std::vector<Row> table = {
      {200, false, End::kServed},   {201, true, End::kServed},   {202, false, End::kServed},
      {402, true, End::kServed},     // a declined payment, stored and replayed
      {422, true, End::kServed},     // an address the shipping participant cannot serve
      {409, true, End::kServed},     // out of stock, stored
      {409, false, End::kComeBack},  // in progress, a tombstone, a compensated action
      {429, false, End::kComeBack},  // a tenant's running sagas at their limit
      {400, false, End::kRefused},  {401, false, End::kRefused}, {403, false, End::kRefused},
      {404, false, End::kRefused},  {405, false, End::kRefused}, {408, false, End::kRefused},
      {411, false, End::kRefused},  {413, false, End::kRefused}, {415, false, End::kRefused},
      {422, false, End::kRefused},  // a key reused with another body, an input not taken
      {431, false, End::kRefused},  {402, false, End::kRefused},  // not stored: the edge's own
      {500, false, End::kFailed},   {502, true, End::kFailed},    // a failed saga's 502 too
      {503, false, End::kFailed},   {504, false, End::kFailed},
  };
  for (const auto& row : table) {
    EXPECT_EQ(RequestEndOf(row.status, row.stored), row.end)
        << row.status << (row.stored ? " stored" : " of the edge");
  }
  EXPECT_FALSE(IsSpanError(End::kServed));
  EXPECT_FALSE(IsSpanError(End::kComeBack));
  EXPECT_TRUE(IsSpanError(End::kRefused));
  EXPECT_TRUE(IsSpanError(End::kFailed));
}

TEST(SpanStatusRule, EndingASpanSetsItsStatusItsHttpStatusAndAKindNeverTheClientsBytes) {
  std::vector<SpanData> out;
  std::mutex m;
  {
    Exporter exporter(
        [&](const std::vector<SpanData>& batch) {
          std::lock_guard lock(m);
          out.insert(out.end(), batch.begin(), batch.end());
          return true;
        },
        {.flush_interval = std::chrono::milliseconds(1)});
    Tracer tracer("payment", &exporter);
    auto declined = tracer.Start("POST /v1/charges", {}, SpanKind::kServer);
    EndRequestSpan(declined, 402, /*stored_outcome=*/true);
    declined.End();
    auto malformed = tracer.Start("POST /v1/charges", {}, SpanKind::kServer);
    EndRequestSpan(malformed, 400, /*stored_outcome=*/false);
    malformed.End();
    auto reused = tracer.Start("POST /v1/orders", {}, SpanKind::kServer);
    EndRequestSpan(reused, RequestEnd::kRefused, "key reused");
    reused.End();
    auto effect = tracer.Start("business effect", {});
    EndWorkSpan(effect, 402, "refused (stored and replayed)");
    effect.End();
  }  // the exporter drains
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].status, SpanStatus::kOk);
  EXPECT_EQ(std::get<long long>(out[0].attributes.at("http.status_code")), 402);
  EXPECT_EQ(out[1].status, SpanStatus::kError);
  EXPECT_EQ(out[1].status_message, "HTTP 400");
  EXPECT_EQ(out[2].status, SpanStatus::kError);
  EXPECT_EQ(out[2].status_message, "key reused");
  EXPECT_EQ(out[3].status, SpanStatus::kError);
  EXPECT_EQ(out[3].status_message, "refused (stored and replayed)");
}

}  // namespace
