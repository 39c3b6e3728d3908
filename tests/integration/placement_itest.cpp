// Tenants on several clusters at a participant of a team's own (idemsaga::Participant with
// ParticipantServiceOptions::placement_url and cluster), over real HTTP: a tenant placed on
// another cluster, or frozen by a move, is answered 503 + Retry-After naming its cluster, and
// nothing is stored or done for it; a tenant placed here is served as ever.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <idemsaga/participant.hpp>

#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using test_support::Call;
using test_support::Post;
using test_support::ScratchDatabase;

constexpr const char* kToken = "dev-service-token";

TEST(Placement, ATeamsParticipantServesOnlyTheTenantsPlacedOnItsClusterAndStoresNothingElse) {
  ScratchDatabase dir("directory"), db("guard");
  dir.Exec(
      "INSERT INTO tenant_placement (tenant_id, cluster, state, moving_to) VALUES "
      "('acme', 'c1', 'active', NULL), ('globex', 'c2', 'active', NULL), "
      "('initech', 'c1', 'frozen', 'c2')");
  std::atomic<int> sent{0};
  idemsaga::Participant mail({.name = "mail",
                              .database_url = db.url(),
                              .service_token = kToken,
                              .placement_url = dir.url(),
                              .cluster = "c1"});
  mail.ExternalAction(
      "/v1/emails", [](const nlohmann::json&) { return std::string(); },
      [&](const idemsaga::ExternalCall&) {
        ++sent;
        return idemsaga::Response{201, R"({"sent":true})", {}};
      });
  int port = mail.Start("127.0.0.1", 0);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(20);
  auto call = [&](const std::string& tenant) {
    return Post(c, "/v1/emails",
                Call{.key = "k-" + tenant, .body = "{}", .tenant = tenant, .token = kToken});
  };

  auto served = call("acme");
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 201) << served->body;
  for (const auto& [tenant, cluster] :
       std::vector<std::pair<std::string, std::string>>{{"globex", "c2"}, {"initech", "c1"}}) {
    auto refused = call(tenant);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 503) << tenant << ": " << refused->body;
    EXPECT_TRUE(refused->has_header("Retry-After")) << tenant;
    EXPECT_EQ(refused->get_header_value("Idemsaga-Tenant-Cluster"), cluster) << tenant;
  }
  EXPECT_EQ(sent.load(), 1);
  EXPECT_EQ(db.Count("SELECT count(*) FROM idempotency_keys"), 1);
  EXPECT_EQ(db.Text("SELECT tenant_id FROM idempotency_keys"), "acme");
  mail.Stop();
}

}  // namespace
