// `distlock run --lock`: MultiHold, several locks as one Hold (multi_hold.hpp).
#include "cli/run/multi_hold.hpp"

#include <algorithm>

#include "distlock/error.hpp"

namespace distlock::cli::run {

SetSpan SetSpan::begin(std::shared_ptr<Tracer> tracer, const std::string& traceparent, std::string names,
                       std::string backend) {
  SetSpan span;
  span.tracer = std::move(tracer);
  span.clock = system_steady_clock();
  if (const auto given = TraceContext::parse(traceparent)) {
    span.context = given->child();
    span.parent = given->span_id;
  } else {
    span.context = TraceContext::random();
  }
  span.names = std::move(names);
  span.backend = std::move(backend);
  span.start = span.clock->now();
  span.start_wall = std::chrono::system_clock::now();
  return span;
}

void SetSpan::deliver(Span& span, Clock::time_point end) const noexcept {
  span.name = "distlock.lock_set";
  span.context = context;
  span.parent_span_id = parent;
  span.start = start;
  span.end = std::max(end, start);
  span.start_wall = start_wall;
  span.end_wall =
      start_wall + std::chrono::duration_cast<std::chrono::system_clock::duration>(span.end - start);
  span.lock_name = names;
  span.backend = backend;
  tracer->on_span(span);
}

void SetSpan::end_not_acquired(const std::error_code& ec, const std::string& what) const noexcept {
  try {
    Span span;
    span.kind = SpanKind::wait;
    if (ec == errc::busy) {
      span.outcome = SpanOutcome::busy;
    } else if (ec == errc::timeout) {
      span.outcome = SpanOutcome::timed_out;
    } else if (ec == errc::cancelled) {
      span.outcome = SpanOutcome::cancelled;
    } else {
      span.outcome = SpanOutcome::error;
      span.error = ec;
    }
    span.detail = what;
    deliver(span, clock->now());
  } catch (...) {  // a span's strings could not be allocated: the run goes on without it
  }
}

MultiHold::MultiHold(MultiLease multi, std::optional<SetSpan> span)
    : multi_(std::move(multi)), span_(std::move(span)) {
  for (const Lease& lease : multi_.leases()) label_ += (label_.empty() ? "" : ",") + lease.name();
}

MultiHold::~MultiHold() {
  if (!span_ || span_ended_) return;
  std::error_code ec;  // released here rather than by ~MultiLease, so the span ends after it
  release(ec);
}

std::optional<TraceContext> MultiHold::trace_context() const {
  if (!span_) return std::nullopt;
  return span_->context;
}

MultiHold::LossSeen MultiHold::loss_before_release() const noexcept {
  LossSeen seen;
  if (!span_ || span_ended_) return seen;
  try {
    seen.reason = loss_reason();
    if (seen.reason != LossReason::none) seen.detail = loss_detail();
  } catch (...) {  // no detail: the span still says lost
  }
  return seen;
}

void MultiHold::end_span(const std::error_code& ec, const LossSeen& seen) noexcept {
  if (!span_ || span_ended_) return;
  span_ended_ = true;
  try {
    Span span;
    span.kind = SpanKind::hold;
    if (ec == errc::lost || seen.reason != LossReason::none) {
      span.outcome = SpanOutcome::lost;
      span.loss_reason = seen.reason;
      span.detail = seen.detail;
    } else if (ec) {
      span.outcome = SpanOutcome::error;
      span.error = ec;
      span.detail = ec.message();
    } else {
      span.outcome = SpanOutcome::released;
    }
    span_->deliver(span, span_->clock->now());  // after every name's release: after each child
  } catch (...) {  // a span's strings could not be allocated: the release still happened
  }
}

bool MultiHold::owns() const noexcept {
  return multi_.owns();
}

const std::string& MultiHold::name() const noexcept {
  return label_;
}

std::uint64_t MultiHold::token() const {
  if (multi_.size() != 1) {
    throw std::system_error(make_error_code(errc::not_supported),
                            "locks \"" + label_ + "\" have one fencing token per name, not one");
  }
  return multi_.leases().front().token();
}

bool MultiHold::has_token() const noexcept {
  return multi_.size() == 1 && multi_.has_token();
}

std::stop_token MultiHold::stop_token() const noexcept {
  return multi_.stop_token();
}

void MultiHold::on_lost(std::function<void()> fn) {
  on_lost_.emplace_back(multi_.stop_token(), std::move(fn));
}

Millis MultiHold::remaining() const noexcept {
  return multi_.remaining();
}

std::optional<Millis> MultiHold::max_hold_remaining() const noexcept {
  std::optional<Millis> least;
  for (const Lease& lease : multi_.leases()) {
    if (const auto left = lease.max_hold_remaining(); left && (!least || *left < *least)) least = left;
  }
  return least;
}

const Lease* MultiHold::lost_lease() const noexcept {
  const auto& leases = multi_.leases();
  const auto it = std::find_if(leases.begin(), leases.end(),
                               [](const Lease& l) { return l.loss_reason() != LossReason::none; });
  return it == leases.end() ? nullptr : &*it;
}

LossReason MultiHold::loss_reason() const noexcept {
  const Lease* lost = lost_lease();
  return lost ? lost->loss_reason() : LossReason::none;
}

std::string MultiHold::loss_detail() const {
  const Lease* lost = lost_lease();
  if (!lost) return {};
  const std::string detail = lost->loss_detail();
  return "lock \"" + lost->name() +
         "\" of the set: " + (detail.empty() ? to_string(lost->loss_reason()) : detail);
}

void MultiHold::release() {
  on_lost_.clear();
  const LossSeen seen = loss_before_release();  // the leases are gone after the release
  try {
    multi_.release();
  } catch (const std::system_error& e) {
    end_span(e.code(), seen);
    throw;
  }
  end_span({}, seen);
}

void MultiHold::release(std::error_code& ec) noexcept {
  on_lost_.clear();
  const LossSeen seen = loss_before_release();
  multi_.release(ec);
  end_span(ec, seen);
}

std::string MultiHold::tokens_env() const {
  std::string out;
  for (const Lease& lease : multi_.leases()) {
    out += (out.empty() ? "" : ",") + lease.name() + "=" +
           (lease.has_token() ? std::to_string(lease.token()) : std::string("-"));
  }
  return "DISTLOCK_TOKENS=" + out;
}

}  // namespace distlock::cli::run
