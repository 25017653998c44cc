// The engine's tracing part: builds spans and hands them to ClientOptions::tracer.
#include "engine/trace_spans.hpp"

#include <utility>

#include "engine/lease.hpp"

namespace distlock::detail {

namespace {

// A wall-clock reading for the engine-clock instant `at`, from one reading of each clock now.
std::chrono::system_clock::time_point trace_wall_of(const Clock& clock, Clock::time_point at) {
  const auto wall_now = std::chrono::system_clock::now();
  const auto steady_now = clock.now();
  return wall_now - std::chrono::duration_cast<std::chrono::system_clock::duration>(steady_now - at);
}

std::chrono::system_clock::time_point trace_wall_end(std::chrono::system_clock::time_point start_wall,
                                                     Clock::time_point start, Clock::time_point end) {
  return start_wall + std::chrono::duration_cast<std::chrono::system_clock::duration>(end - start);
}

}  // namespace

TraceSpans::TraceSpans(std::shared_ptr<Tracer> tracer, std::string backend,
                       std::string_view client_traceparent, Logger& log)
    : tracer_(std::move(tracer)), backend_(std::move(backend)), log_(log) {
  if (client_traceparent.empty()) return;
  std::string why;
  client_parent_ = TraceContext::parse(client_traceparent, &why);
  if (!client_parent_) {
    log_.log(LogLevel::warning, "ClientOptions::traceparent \"{}\" ignored: {}",
             client_traceparent.substr(0, 64), why);
  }
}

WaitTrace TraceSpans::begin_wait(const LockOptions& opts, Clock::time_point called) {
  WaitTrace w;
  w.start = called;
  w.start_wall = std::chrono::system_clock::now();
  std::optional<TraceContext> parent = client_parent_;
  if (!opts.traceparent.empty()) {
    std::string why;
    if (auto given = TraceContext::parse(opts.traceparent, &why)) {
      parent = given;
    } else {
      log_.log(LogLevel::warning, "LockOptions::traceparent \"{}\" ignored: {}",
               opts.traceparent.substr(0, 64), why);
    }
  }
  if (parent) {
    w.wait = parent->child();
    w.parent = parent->span_id;
  } else {
    w.wait = TraceContext::random();
  }
  return w;
}

Span TraceSpans::wait_span(const WaitTrace& w, std::string_view name, std::string_view owner,
                           SpanOutcome outcome, const std::error_code& ec, Clock::time_point end) const {
  Span s;
  s.kind = SpanKind::wait;
  s.name = "distlock.wait";
  s.context = w.wait;
  s.parent_span_id = w.parent;
  s.start = w.start;
  s.end = end;
  s.start_wall = w.start_wall;
  s.end_wall = trace_wall_end(w.start_wall, w.start, end);
  s.lock_name = std::string(name);
  fill_owner(s, owner);
  s.outcome = outcome;
  s.error = ec;
  if (ec) s.detail = ec.message();
  return s;
}

std::unique_ptr<HoldTrace> TraceSpans::begin_hold(const WaitTrace& w, Clock::time_point granted) const {
  auto h = std::make_unique<HoldTrace>();
  h->hold = w.wait.child();
  h->parent = w.parent;
  h->start = granted;
  h->start_wall = trace_wall_end(w.start_wall, w.start, granted);
  return h;
}

void TraceSpans::fill_owner(Span& s, std::string_view owner) const {
  const auto [id, info] = split_owner(owner);
  s.owner = std::string(id);
  if (info) s.holder_info = std::string(*info);
  s.backend = backend_;
}

void TraceSpans::fill_lease(Span& s, const HeldLock& held) const {
  s.lock_name = held.name;
  if (held.has_token) s.token = held.token;
  fill_owner(s, held.owner);
}

Span TraceSpans::hold_span(const HeldLock& held, SpanOutcome outcome, Clock::time_point end,
                           const std::error_code& ec, distlock::LossReason reason, std::string detail) const {
  const HoldTrace& t = *held.trace;
  Span s;
  s.kind = SpanKind::hold;
  s.name = "distlock.hold";
  s.context = t.hold;
  s.parent_span_id = t.parent;
  s.start = t.start;
  s.end = end;
  s.start_wall = t.start_wall;
  s.end_wall = trace_wall_end(t.start_wall, t.start, end);
  fill_lease(s, held);
  s.outcome = outcome;
  s.error = ec;
  s.loss_reason = reason;
  s.detail = std::move(detail);
  if (s.detail.empty() && ec) s.detail = ec.message();
  return s;
}

Span TraceSpans::renewal_span(const HeldLock& held, SpanOutcome outcome, Clock::time_point sent,
                              Clock::time_point replied, std::uint32_t batch,
                              const std::error_code& ec) const {
  const HoldTrace& t = *held.trace;
  Span s;
  s.kind = SpanKind::renewal;
  s.name = "distlock.renewal";
  s.context = t.hold.child();
  s.parent_span_id = t.hold.span_id;
  s.start = sent;
  s.end = replied;
  s.start_wall = trace_wall_of(*held.clock, sent);
  s.end_wall = trace_wall_end(s.start_wall, sent, replied);
  fill_lease(s, held);
  s.outcome = outcome;
  s.error = ec;
  if (ec) s.detail = ec.message();
  s.batch_size = batch;
  return s;
}

Span TraceSpans::loss_span(const HeldLock& held, distlock::LossReason reason, std::string detail,
                           Clock::time_point at) const {
  const HoldTrace& t = *held.trace;
  Span s;
  s.kind = SpanKind::loss;
  s.name = "distlock.loss";
  s.context = t.hold.child();
  s.parent_span_id = t.hold.span_id;
  s.start = s.end = at;
  s.start_wall = s.end_wall = trace_wall_of(*held.clock, at);
  fill_lease(s, held);
  s.outcome = SpanOutcome::lost;
  s.loss_reason = reason;
  s.detail = std::move(detail);
  return s;
}

void TraceSpans::deliver(const Span& span) const noexcept {
  tracer_->on_span(span);  // noexcept by contract (Tracer::on_span)
}

}  // namespace distlock::detail
