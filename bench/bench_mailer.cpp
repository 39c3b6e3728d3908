// The participant of bench/stores.sh: a library participant (idemsaga::Participant) whose one
// route is an external effect that does nothing but answer, so that what wrk measures is the
// guard on its key store (claim, record; or one consistent read for a replay) plus HTTP, the
// same on every store: --store postgres|redis|dynamodb and Participant::Run's other flags.
#include <idemsaga/participant.hpp>

int main(int argc, char** argv) {
  idemsaga::Participant mailer({.name = "mailer"});
  mailer.ExternalAction(
      "/v1/emails",
      [](const nlohmann::json& body) {
        return body.contains("to") && body["to"].is_string() ? "" : "to: a string is required";
      },
      [](const idemsaga::ExternalCall& call) {
        return idemsaga::Response{201,
                                  nlohmann::json{{"email_id", "em_" + call.request.key}}.dump()};
      });
  return mailer.Run(argc, argv);
}
