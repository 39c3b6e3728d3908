#include "common/trace/span.hpp"

#include "common/trace/exporter.hpp"
#include "common/trace/trace_context.hpp"

namespace idemsaga::common::trace {

long long NowUnixNano() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Span::Span(Span&& other) noexcept
    : exporter_(other.exporter_), data_(std::move(other.data_)), ended_(other.ended_) {
  other.ended_ = true;
}

Span& Span::operator=(Span&& other) noexcept {
  if (this != &other) {
    End();
    exporter_ = other.exporter_;
    data_ = std::move(other.data_);
    ended_ = other.ended_;
    other.ended_ = true;
  }
  return *this;
}

Span& Span::Set(const std::string& key, AttributeValue value) {
  if (!ended_) data_.attributes[key] = std::move(value);
  return *this;
}

Span& Span::Error(const std::string& message) {
  data_.status = SpanStatus::kError;
  data_.status_message = message;
  return *this;
}

Span& Span::Ok() {
  if (data_.status != SpanStatus::kError) data_.status = SpanStatus::kOk;
  return *this;
}

Span& Span::Reparent(const SpanContext& parent) {
  if (parent.valid()) {
    data_.trace_id = parent.trace_id;
    data_.parent_span_id = parent.span_id;
  }
  return *this;
}

SpanContext Span::context() const { return {data_.trace_id, data_.span_id}; }

void Span::End() {
  if (ended_) return;
  ended_ = true;
  data_.end_unix_nano = NowUnixNano();
  if (exporter_ != nullptr) exporter_->Enqueue(std::move(data_));
}

Span Tracer::Start(const std::string& name, const SpanContext& parent, SpanKind kind) const {
  return StartWithId(name, parent, NewSpanId(), kind);
}

Span Tracer::StartWithId(const std::string& name, const SpanContext& parent, std::string span_id,
                         SpanKind kind) const {
  SpanData d;
  d.trace_id = parent.valid() ? parent.trace_id : NewTraceId();
  d.parent_span_id = parent.valid() ? parent.span_id : "";
  d.span_id = std::move(span_id);
  d.service = service_;
  d.name = name;
  d.kind = kind;
  d.start_unix_nano = NowUnixNano();
  Span s(exporter_, std::move(d));
  s.ended_ = false;
  return s;
}

}  // namespace idemsaga::common::trace
