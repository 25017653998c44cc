// The engine's tracing part (distlock/tracing.hpp): made only when ClientOptions::tracer is
// set, so without a tracer the engine's only cost is a test of a null pointer
// (Engine::tracing_, HeldLock::trace). It builds the spans of waits, holds, renewals and
// losses and hands them to the user's tracer; Engine decides on which thread (the caller's
// for waits and releases, the event thread for renewals and losses).
//
// Thread-safety: every member may be called from any thread at once (the parent context
// given to the client is fixed at construction; the rest is per call).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/clock.hpp"
#include "distlock/options.hpp"
#include "distlock/tracing.hpp"
#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::detail {

struct HeldLock;
struct LossSpans;

/// The trace of one acquisition's wait, begun when the acquire call began.
struct WaitTrace {
  TraceContext wait;                     // the wait span's context
  std::array<std::uint8_t, 8> parent{};  // the caller's span id (zero: a root)
  Clock::time_point start{};             // on the engine's clock
  std::chrono::system_clock::time_point start_wall{};
};

/// The trace of one hold (kept in HeldLock::trace from the grant on).
struct HoldTrace {
  TraceContext hold;  // the hold span's context: the parent of renewals and the loss
  std::array<std::uint8_t, 8> parent{};
  Clock::time_point start{};
  std::chrono::system_clock::time_point start_wall{};
  // Who gives which span is decided under loss_mu (Engine::trace_loss, Engine::trace_hold_end):
  // the hold span once (by the release, or by the loss that ended it), the loss span once (by
  // the thread that declared the loss, or by the release of the lost lease when that comes
  // first). A loss publishes its spans here together with the claims, so a release that finds
  // the loss traced finds its spans too. A leaf lock: nothing else is locked under it.
  AnnotatedMutex loss_mu;
  bool ended DISTLOCK_GUARDED_BY(loss_mu) = false;        // the hold span was built
  bool loss_traced DISTLOCK_GUARDED_BY(loss_mu) = false;  // the loss span was built
  std::shared_ptr<LossSpans> loss DISTLOCK_GUARDED_BY(loss_mu);
};

/// The spans of a loss (its loss span, and the hold span when the loss ended it), given to the
/// tracer once: by the event thread, or by the release of the lost lease if that comes first
/// (Engine::trace_hold_end), so they are with the tracer when that release returns.
struct LossSpans {
  std::atomic<bool> delivered{false};
  std::vector<Span> spans;
};

class TraceSpans {
 public:
  /// `backend`: the URL scheme; `client_traceparent`: ClientOptions::traceparent (a
  /// malformed one is logged and ignored here, once).
  TraceSpans(std::shared_ptr<Tracer> tracer, std::string backend, std::string_view client_traceparent,
             Logger& log);

  /// The wait of an acquisition called at `called` with `opts` (its traceparent, else the
  /// client's, is the parent; a malformed one is logged and ignored).
  WaitTrace begin_wait(const LockOptions& opts, Clock::time_point called);
  /// The wait span, ended at `end` with `outcome` (`ec` for the failed ones).
  Span wait_span(const WaitTrace& w, std::string_view name, std::string_view owner, SpanOutcome outcome,
                 const std::error_code& ec, Clock::time_point end) const;
  /// The hold that begins at `granted` (a sibling of the wait span, in its trace).
  std::unique_ptr<HoldTrace> begin_hold(const WaitTrace& w, Clock::time_point granted) const;
  /// The hold span of `held` ended at `end` (the caller gives it once: HoldTrace::ended).
  Span hold_span(const HeldLock& held, SpanOutcome outcome, Clock::time_point end,
                 const std::error_code& ec = {}, distlock::LossReason reason = distlock::LossReason::none,
                 std::string detail = {}) const;
  /// A renewal span of `held` (sent at `sent`, answered at `replied`) in a batch of `batch`.
  Span renewal_span(const HeldLock& held, SpanOutcome outcome, Clock::time_point sent,
                    Clock::time_point replied, std::uint32_t batch, const std::error_code& ec) const;
  /// The zero-length loss span of `held` at `at`.
  Span loss_span(const HeldLock& held, distlock::LossReason reason, std::string detail,
                 Clock::time_point at) const;

  /// Hands `span` to the tracer (Tracer::on_span is noexcept: an exception escaping it
  /// ends the process).
  void deliver(const Span& span) const noexcept;

 private:
  /// The owner id, the holder info after it and the backend scheme.
  void fill_owner(Span& s, std::string_view owner) const;
  void fill_lease(Span& s, const HeldLock& held) const;
  std::shared_ptr<Tracer> tracer_;
  std::string backend_;
  std::optional<TraceContext> client_parent_;
  Logger& log_;
};

}  // namespace distlock::detail
