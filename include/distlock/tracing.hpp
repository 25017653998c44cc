// distlock/tracing.hpp — spans for waits and holds, handed to a tracer you provide.
//
// Set `ClientOptions::tracer` and the client reports, for every acquisition that reaches
// the engine (every backend: the engine is written once for all of them):
//   wait     from the acquire call to its outcome (acquired, busy, timed out, cancelled, error);
//   hold     from the grant to the release (or to the loss);
//   renewal  one per lease per renewal round (send to reply), a child of its hold span;
//   loss     a zero-length span at the moment the loss is declared, with its LossReason,
//            a child of its hold span (which ends at that moment).
// Each span carries W3C trace context (https://www.w3.org/TR/trace-context/): the wait and
// hold spans of one acquisition share a trace id and have the same parent, the caller's
// `traceparent` (LockOptions::traceparent, else ClientOptions::traceparent) when one is
// given and valid, else they are roots of a new trace. A malformed traceparent is ignored
// (a warning is logged), never an error of the lock call. Lease::trace_context() is the
// hold span's context, to pass on to the work done under the lock.
//
// No tracing library is linked: a Tracer is an interface; examples/tracing has one that
// writes OTLP/JSON lines. Without a tracer the engine only tests a null pointer.
//
// Thread-safety: Tracer::on_span may be called from several threads at once: on the
// acquiring thread (wait spans), on the releasing thread (hold spans ended by a release),
// and on the client's event thread (renewal and loss spans, and hold spans ended by a
// loss: never on the renewer, the watchdog or a backend's thread, so a slow tracer
// cannot delay a renewal or a loss signal, though it delays Lease::on_lost callbacks).
// It is noexcept: an exception escaping it ends the process. TraceContext is a value type.
//
// Example:
//   struct Printer : distlock::Tracer {
//     void on_span(const distlock::Span& s) noexcept override {
//       const auto us = std::chrono::duration_cast<std::chrono::microseconds>(s.end - s.start);
//       std::clog << distlock::to_string(s.kind) << ' ' << s.lock_name << ' ' << us.count() << " us";
//       std::clog << std::endl;
//     }
//   };
//   distlock::ClientOptions options;
//   options.tracer = std::make_shared<Printer>();
//   options.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
//   auto traced = distlock::connect("file:///tmp/locks", options);
//   distlock::Lease lease = traced.acquire("reports/nightly");
//   std::optional<distlock::TraceContext> ctx = lease.trace_context();  // the hold span
//   std::string for_the_job = ctx ? ctx->traceparent() : std::string();  // its TRACEPARENT
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "distlock/clock.hpp"
#include "distlock/export.hpp"
#include "distlock/hold.hpp"

namespace distlock {

/// A W3C trace context: trace id, span id and trace flags (the `traceparent` header).
struct DISTLOCK_EXPORT TraceContext {
  std::array<std::uint8_t, 16> trace_id{};
  std::array<std::uint8_t, 8> span_id{};
  std::uint8_t flags = 0;  ///< bit 0: sampled

  /// Both ids non-zero.
  bool valid() const noexcept;
  /// Parses "00-<32 hex>-<16 hex>-<2 hex>" (exactly 55 characters, version 00, lowercase
  /// hex, non-zero ids). nullopt when malformed; `why` (optional) then names the problem.
  static std::optional<TraceContext> parse(std::string_view traceparent, std::string* why = nullptr);
  /// A context with a new random trace id and span id, flags 01 (sampled).
  static TraceContext random();
  /// The same trace and flags with a new random span id.
  TraceContext child() const;
  /// "00-<trace id>-<span id>-<flags>".
  std::string traceparent() const;
  std::string trace_id_hex() const;  ///< 32 lowercase hex digits
  std::string span_id_hex() const;   ///< 16 lowercase hex digits
};

/// What a span measured.
enum class SpanKind { wait, hold, renewal, loss };
/// "wait", "hold", "renewal", "loss".
DISTLOCK_EXPORT const char* to_string(SpanKind kind) noexcept;

/// How a span ended.
enum class SpanOutcome {
  acquired,   ///< wait: the lock was granted
  busy,       ///< wait: one attempt (wait 0), held by another owner
  timed_out,  ///< wait: LockOptions::wait ran out
  cancelled,  ///< wait: LockOptions::cancel was requested
  error,      ///< wait: another error (`error` says which); hold: the release failed
  released,   ///< hold: an orderly release
  lost,       ///< hold and loss: the lease was lost (`loss_reason` says why)
  renewed,    ///< renewal: the server extended the lease
  refused,    ///< renewal: the server says another owner (or nobody) holds it
  failed,     ///< renewal: no answer, or an error (`error` says which)
};
/// "acquired", "timed_out", ...
DISTLOCK_EXPORT const char* to_string(SpanOutcome outcome) noexcept;

/// One finished span.
struct DISTLOCK_EXPORT Span {
  SpanKind kind = SpanKind::wait;
  /// "distlock.wait", "distlock.hold", "distlock.renewal", "distlock.loss".
  std::string name;
  /// This span's trace id and span id (and the flags of its trace).
  TraceContext context;
  /// The parent span's id; all zero for a root span.
  std::array<std::uint8_t, 8> parent_span_id{};
  /// On the client's clock (ClientOptions::clock, CLOCK_BOOTTIME by default): end - start
  /// is the duration. A loss span has start == end.
  Clock::time_point start{}, end{};
  /// The same instants on the wall clock for export: start_wall was read once when the
  /// span started, end_wall = start_wall + (end - start), so both clocks agree on the length.
  std::chrono::system_clock::time_point start_wall{}, end_wall{};
  std::string lock_name;
  /// The fencing token (spans after the grant, on backends with tokens).
  std::optional<std::uint64_t> token;
  /// The owner id the server stores for this acquisition (empty for a failed wait that never
  /// got one); the holder description (LockOptions::holder_info) apart.
  std::string owner;
  std::string holder_info;
  /// The URL scheme: "redis", "file", ...
  std::string backend;
  SpanOutcome outcome = SpanOutcome::acquired;
  /// The error of a wait, a release or a renewal that failed (empty otherwise).
  std::error_code error;
  /// The loss span's reason, and the hold span's when the hold ended lost.
  LossReason loss_reason = LossReason::none;
  /// One sentence for people (the loss detail, an error's text); may be empty.
  std::string detail;
  /// Renewal: how many leases the round renewed in one backend batch.
  std::uint32_t batch_size = 0;
};

/// Receives finished spans (see the file comment for the threads).
class DISTLOCK_EXPORT Tracer {
 public:
  virtual ~Tracer();
  virtual void on_span(const Span& span) noexcept = 0;
};

}  // namespace distlock
