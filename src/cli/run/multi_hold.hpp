// `distlock run --lock A --lock B`: several locks held as one `Hold`, so the runner's one code
// path (supervise, the loss wake-up, release) serves them as it serves one lock.
//
// MultiHold wraps a distlock::MultiLease (Client::acquire_all). It is an adapter of the CLI,
// not a public Hold: Hold's name() and token() speak of one name and one fencing token, which a
// set of names does not have, and a MultiLease handed to generic Hold code would be taken for
// one lock. What a member means here:
//   owns()              every name held (MultiLease::owns);
//   name()              the names, canonical order, joined by "," (for messages only);
//   token()/has_token() the one name's token when the set has exactly one name; with several,
//                       has_token() is false and token() throws errc::not_supported (the job
//                       gets every name's token in $DISTLOCK_TOKENS: tokens_env());
//   stop_token()        fires when any one name is lost;
//   on_lost(fn)         runs `fn` once when any one name is lost, on the thread that detected
//                       the loss (a stop callback), not on the client's event thread;
//   remaining()         the least time left of any name; max_hold_remaining() likewise;
//   loss_reason()/loss_detail()  of the first lost name, the detail naming it;
//   release()           releases every name (MultiLease::release).
//
// Tracing (docs/tracing.md "distlock run"): with a tracer, the set has a span of its own,
// `distlock.lock_set` (SetSpan), from just before the acquire_all call to the end of the release
// of every name (so after its children's ends). It is the parent of every name's wait
// and hold spans (acquire_all is given its context as traceparent, so they share one trace even
// without a $TRACEPARENT), its own parent is the runner's $TRACEPARENT (none: a root), and
// trace_context() gives it to the job as TRACEPARENT, as a Lease's hold span is for one lock.
// A set lost while held ends `lost` (the first lost name's reason and detail) at its release:
// the lost name's own hold span, a child, ends at the loss.
//
// Thread-safety: as Hold: the const members from any thread at the same time; on_lost(),
// release() and moving belong to one thread at a time. The set span is given to the tracer on
// the thread that calls acquire_all (not taken) or release() / the destructor.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>

#include "distlock/clock.hpp"
#include "distlock/hold.hpp"
#include "distlock/multi_lease.hpp"
#include "distlock/tracing.hpp"

namespace distlock::cli::run {

/// The span of a set of locks (`distlock.lock_set`), begun before acquire_all is called.
struct SetSpan {
  std::shared_ptr<Tracer> tracer;
  std::shared_ptr<Clock> clock;          // the client's default clock, as the engine's spans use
  TraceContext context;                  // this span; the traceparent acquire_all is given
  std::array<std::uint8_t, 8> parent{};  // the runner's $TRACEPARENT span id; zero: a root
  std::string names;                     // the names joined by ","
  std::string backend;                   // the URL scheme
  Clock::time_point start{};
  std::chrono::system_clock::time_point start_wall{};

  /// Begins the span now: a child of `traceparent` (valid, or empty for a new trace).
  static SetSpan begin(std::shared_ptr<Tracer> tracer, const std::string& traceparent, std::string names,
                       std::string backend);
  /// Ends it now for an acquire_all that failed with `ec` (busy, timed out, cancelled, error).
  void end_not_acquired(const std::error_code& ec, const std::string& what) const noexcept;
  /// Hands the span, ended at `end`, to the tracer.
  void deliver(Span& span, Clock::time_point end) const noexcept;
};

class MultiHold final : public Hold {
 public:
  /// `span`: the set's span when the runner traces (it is ended by release() or the
  /// destructor, which then releases every name itself).
  explicit MultiHold(MultiLease multi, std::optional<SetSpan> span = std::nullopt);
  ~MultiHold() override;
  MultiHold(const MultiHold&) = delete;
  MultiHold& operator=(const MultiHold&) = delete;

  bool owns() const noexcept override;
  const std::string& name() const noexcept override;
  std::uint64_t token() const override;
  bool has_token() const noexcept override;
  std::stop_token stop_token() const noexcept override;
  void on_lost(std::function<void()> fn) override;
  Millis remaining() const noexcept override;
  std::optional<Millis> max_hold_remaining() const noexcept override;
  LossReason loss_reason() const noexcept override;
  std::string loss_detail() const override;
  void release() override;
  void release(std::error_code& ec) noexcept override;

  const MultiLease& multi() const noexcept { return multi_; }
  /// "DISTLOCK_TOKENS=a=1,b=2": each name=token in the canonical order, "-" for a name
  /// without a token (Redlock), as the shard runner writes "-".
  std::string tokens_env() const;
  /// The set span's context (the job's TRACEPARENT); nullopt when the runner does not trace.
  std::optional<TraceContext> trace_context() const;

 private:
  /// The first lost lease, or null.
  const Lease* lost_lease() const noexcept;
  /// Which name was lost and why, read before a release empties the MultiLease.
  struct LossSeen {
    LossReason reason = LossReason::none;
    std::string detail;
  };
  LossSeen loss_before_release() const noexcept;
  /// Ends the set span after the release of every name ended with `ec` (once).
  void end_span(const std::error_code& ec, const LossSeen& seen) noexcept;

  MultiLease multi_;
  std::string label_;
  std::list<std::stop_callback<std::function<void()>>> on_lost_;
  std::optional<SetSpan> span_;
  bool span_ended_ = false;
};

}  // namespace distlock::cli::run
