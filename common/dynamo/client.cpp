#include "common/dynamo/client.hpp"

#include <httplib.h>

#include <cstdlib>
#include <ctime>

#include "common/crypto.hpp"

namespace idemsaga::common::dynamo {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string AmzDate(std::chrono::system_clock::time_point now) {
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[20];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

// The exception's name from an error answer's __type ("com.amazonaws...#Name").
std::string TypeOf(const nlohmann::json& body) {
  const std::string type = body.is_object() ? body.value("__type", "") : "";
  const auto hash = type.rfind('#');
  return hash == std::string::npos ? type : type.substr(hash + 1);
}

std::string MessageOf(const nlohmann::json& body) {
  if (!body.is_object()) return "";
  if (body.contains("message") && body["message"].is_string()) return body["message"];
  if (body.contains("Message") && body["Message"].is_string()) return body["Message"];
  return "";
}

bool Throttled(const std::string& type) {
  return type == "ProvisionedThroughputExceededException" || type == "ThrottlingException" ||
         type == "RequestLimitExceeded" || type == "LimitExceededException";
}

}  // namespace

std::string SignV4(const SignedRequest& req, const Credentials& credentials,
                   const std::string& region, const std::string& service,
                   const std::string& amz_date) {
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : req.headers) {  // a std::map: sorted by name
    // Values are trimmed; the requests signed here carry no inner runs of spaces.
    const auto first = value.find_first_not_of(" \t");
    const auto last = value.find_last_not_of(" \t");
    canonical_headers += name + ":" +
                         (first == std::string::npos ? "" : value.substr(first, last - first + 1)) +
                         "\n";
    signed_headers += (signed_headers.empty() ? "" : ";") + name;
  }
  const std::string canonical = req.method + "\n" + req.path + "\n" + req.query + "\n" +
                                canonical_headers + "\n" + signed_headers + "\n" +
                                Sha256Hex(req.body);
  const std::string date = amz_date.substr(0, 8);
  const std::string scope = date + "/" + region + "/" + service + "/aws4_request";
  const std::string to_sign =
      "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + Sha256Hex(canonical);
  std::string key = HmacSha256("AWS4" + credentials.secret_access_key, date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  key = HmacSha256(key, "aws4_request");
  return "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + "/" + scope +
         ", SignedHeaders=" + signed_headers + ", Signature=" + Hex(HmacSha256(key, to_sign));
}

Client::Options Client::FromEnvironment(const std::string& url) {
  Options o{.url = url};
  o.region = Env("AWS_REGION");
  if (o.region.empty()) o.region = Env("AWS_DEFAULT_REGION");
  if (o.region.empty()) o.region = "us-east-1";
  o.credentials = {Env("AWS_ACCESS_KEY_ID"), Env("AWS_SECRET_ACCESS_KEY"),
                   Env("AWS_SESSION_TOKEN")};
  // An emulator (dynalite, DynamoDB Local) checks the signature's shape, not its key.
  if (o.credentials.access_key_id.empty()) o.credentials = {"local", "local", ""};
  return o;
}

Client::Client(Options options) : options_(std::move(options)) {
  const std::string scheme = "http://";
  if (options_.url.rfind(scheme, 0) != 0) {
    throw std::invalid_argument("a DynamoDB endpoint is http://host[:port] (no TLS here), not '" +
                                options_.url + "'");
  }
  host_ = options_.url.substr(scheme.size());
  if (auto slash = host_.find('/'); slash != std::string::npos) host_.resize(slash);
  if (host_.empty()) throw std::invalid_argument("a DynamoDB endpoint names no host");
}

struct Client::Connection {
  explicit Connection(const std::string& url) : http(url) {}
  httplib::Client http;
  std::chrono::steady_clock::time_point idle_since;
};

namespace {

// A kept-alive connection idle longer than this is closed rather than used: the server may
// have closed it meanwhile (Node's HTTP server, dynalite's, after 5 s), and a request sent on
// it then fails after it may have been sent, which a conditional write cannot simply retry.
constexpr auto kMaxIdle = std::chrono::seconds(2);

}  // namespace

Client::~Client() = default;

std::unique_ptr<Client::Connection> Client::Borrow() {
  {
    std::lock_guard lock(mutex_);
    while (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      if (std::chrono::steady_clock::now() - c->idle_since < kMaxIdle) return c;
    }
  }
  auto c = std::make_unique<Connection>("http://" + host_);
  c->http.set_keep_alive(true);
  // A request is written in two parts (headers, body): without it, Nagle's algorithm holds the
  // body until the server's delayed ACK, some 40 ms per call.
  c->http.set_tcp_nodelay(true);
  c->http.set_connection_timeout(options_.connect_timeout);
  c->http.set_read_timeout(options_.request_timeout);
  c->http.set_write_timeout(options_.request_timeout);
  return c;
}

void Client::Return(std::unique_ptr<Connection> connection) {
  connection->idle_since = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  idle_.push_back(std::move(connection));
}

Client::Result Client::Call(const std::string& operation, const nlohmann::json& request) {
  SignedRequest req;
  req.body = request.dump();
  req.headers = {{"content-type", "application/x-amz-json-1.0"},
                 {"host", host_},
                 {"x-amz-date", AmzDate(std::chrono::system_clock::now())},
                 {"x-amz-target", "DynamoDB_20120810." + operation}};
  if (!options_.credentials.session_token.empty()) {
    req.headers["x-amz-security-token"] = options_.credentials.session_token;
  }
  httplib::Headers headers;
  for (const auto& [name, value] : req.headers) {
    if (name != "content-type") headers.emplace(name == "host" ? "Host" : name, value);
  }
  headers.emplace("Authorization", SignV4(req, options_.credentials, options_.region, "dynamodb",
                                          req.headers["x-amz-date"]));
  auto connection = Borrow();
  auto res = connection->http.Post("/", headers, req.body, "application/x-amz-json-1.0");
  if (!res) {
    throw Unavailable("DynamoDB " + operation + ": " + httplib::to_string(res.error()));
  }
  Return(std::move(connection));
  auto body = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status == 200 && body.is_object()) return {false, std::move(body)};
  const std::string type = TypeOf(body);
  if (res->status == 400 && type == "ConditionalCheckFailedException") return {true, {}};
  const std::string what = "DynamoDB " + operation + " answered " + std::to_string(res->status) +
                           " " + type + ": " + MessageOf(body);
  if (res->status >= 500 || Throttled(type)) throw Unavailable(what);
  throw Error(type.empty() ? "HTTP " + std::to_string(res->status) : type, what);
}

}  // namespace idemsaga::common::dynamo
