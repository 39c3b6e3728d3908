// Spans: one timed operation of one service, in a trace tree. A Span is RAII: it ends and is
// handed to its Tracer's exporter when destroyed (or at End()). Recording never blocks and
// never fails a request: a full export queue drops the span and counts it.
//
// A Tracer is thread-safe; a Span belongs to one thread. Never put secrets in attributes.
//   common::trace::Span span = tracer.Start("POST /v1/orders", parent, SpanKind::kServer);
//   span.Set("tenant", tenant); span.Error("declined");
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace idemsaga::common::trace {

using AttributeValue = std::variant<std::string, long long, bool>;

enum class SpanKind { kInternal = 1, kServer = 2, kClient = 3 };
enum class SpanStatus { kUnset = 0, kOk = 1, kError = 2 };

struct SpanData {
  std::string trace_id;
  std::string span_id;
  std::string parent_span_id;  // "" for a root
  std::string service;
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  long long start_unix_nano = 0;
  long long end_unix_nano = 0;
  SpanStatus status = SpanStatus::kUnset;
  std::string status_message;
  std::map<std::string, AttributeValue> attributes;
};

// Where a span's parent is: ids only.
struct SpanContext {
  std::string trace_id;
  std::string span_id;
  bool valid() const { return !trace_id.empty(); }
};

class Exporter;

class Span {
 public:
  Span() = default;  // a no-op span (tracing off)
  Span(Span&& other) noexcept;
  Span& operator=(Span&& other) noexcept;
  ~Span() { End(); }

  Span& Set(const std::string& key, AttributeValue value);
  Span& Error(const std::string& message);
  Span& Ok();
  // Moves the span into another trace before it ends (a replayed request joins its order's).
  Span& Reparent(const SpanContext& parent);
  SpanContext context() const;
  void End();

 private:
  friend class Tracer;
  Span(Exporter* exporter, SpanData data) : exporter_(exporter), data_(std::move(data)) {}
  Exporter* exporter_ = nullptr;
  SpanData data_;
  bool ended_ = true;
};

class Tracer {
 public:
  // `exporter` may be null: spans are then dropped (tracing off).
  Tracer(std::string service, Exporter* exporter)
      : service_(std::move(service)), exporter_(exporter) {}
  // A child of `parent`, or the root of a new trace when `parent` is not valid.
  Span Start(const std::string& name, const SpanContext& parent,
             SpanKind kind = SpanKind::kInternal) const;
  // A span with a given id (the runner announces a step attempt's id in `traceparent`
  // before the attempt's span ends).
  Span StartWithId(const std::string& name, const SpanContext& parent, std::string span_id,
                   SpanKind kind = SpanKind::kInternal) const;

 private:
  std::string service_;
  Exporter* exporter_;
};

long long NowUnixNano();

}  // namespace idemsaga::common::trace
