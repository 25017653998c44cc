// Engine: where the spans of holds, renewals and losses are handed to the tracer
// (engine/trace_spans.hpp builds them). Losses and renewals are found on the renewer, the
// watchdog or a backend's thread: their spans are delivered on the event thread, so a
// slow tracer never delays a renewal or a loss signal.
#include <memory>
#include <vector>

#include "engine/engine.hpp"

namespace distlock::detail {

void Engine::trace_loss(const HeldLock& held, LossReason reason, const std::string& detail_text,
                        Clock::time_point at) noexcept {
  try {
    const distlock::LossReason pub = public_loss_reason(reason);
    auto loss = std::make_shared<LossSpans>();
    loss->spans.reserve(2);
    loss->spans.push_back(tracing_->loss_span(held, pub, detail_text, at));
    HoldTrace& t = *held.trace;
    {
      LockGuard lk(t.loss_mu);
      // The release of the lost lease came first and gave the loss span (and the hold span) itself.
      if (t.loss_traced) return;
      if (!t.ended)
        loss->spans.push_back(tracing_->hold_span(held, SpanOutcome::lost, at, {}, pub, detail_text));
      t.ended = true;
      t.loss_traced = true;
      t.loss = loss;
    }
    events_.post([this, loss] { deliver_loss_spans(*loss); });
  } catch (...) {  // no memory for the spans: the loss itself is signalled
  }
}

void Engine::deliver_loss_spans(LossSpans& loss) noexcept {
  if (loss.delivered.exchange(true, std::memory_order_acq_rel)) return;
  for (const Span& s : loss.spans) tracing_->deliver(s);
}

void Engine::trace_hold_end(const HeldLock& held, SpanOutcome outcome, Clock::time_point end,
                            const std::error_code& ec) noexcept {
  try {
    const bool lost = outcome == SpanOutcome::lost;
    const distlock::LossReason reason = lost ? held.public_reason() : distlock::LossReason::none;
    std::string detail = lost ? held.public_detail() : std::string();
    std::vector<Span> mine;  // the spans this call gives
    mine.reserve(2);
    std::shared_ptr<LossSpans> loss;
    HoldTrace& t = *held.trace;
    {
      LockGuard lk(t.loss_mu);
      // A loss declared (HeldLock::lost) but not traced yet: its thread may still be in the stop
      // token's callbacks. This release gives the loss span, so it is with the tracer when the
      // release returns; the loss gives none when it gets there (trace_loss).
      const bool give_loss = lost && !t.loss_traced;
      if (give_loss) mine.push_back(tracing_->loss_span(held, reason, detail, end));
      if (!t.ended) mine.push_back(tracing_->hold_span(held, outcome, end, ec, reason, std::move(detail)));
      t.ended = true;
      t.loss_traced = t.loss_traced || give_loss;
      loss = t.loss;
    }
    for (const Span& s : mine) tracing_->deliver(s);
    // A loss traced first: its spans are given here if the event thread has not given them yet,
    // so a runner that exits right after releasing the lost lease (its event thread starved)
    // does not lose them.
    if (loss) deliver_loss_spans(*loss);
  } catch (...) {  // no memory for the span
  }
}

void Engine::trace_renewals(const std::vector<std::shared_ptr<HeldLock>>& due,
                            const std::vector<RenewStatus>& out, Clock::time_point sent,
                            Clock::time_point replied, const std::error_code& ec) noexcept {
  try {
    auto spans = std::make_shared<std::vector<Span>>();
    const auto batch = static_cast<std::uint32_t>(due.size());
    for (std::size_t i = 0; i < due.size(); ++i) {
      if (!due[i]->trace) continue;
      const SpanOutcome outcome = out[i] == RenewStatus::renewed     ? SpanOutcome::renewed
                                  : out[i] == RenewStatus::not_owner ? SpanOutcome::refused
                                                                     : SpanOutcome::failed;
      spans->push_back(tracing_->renewal_span(*due[i], outcome, sent, replied, batch,
                                              outcome == SpanOutcome::failed ? ec : std::error_code()));
    }
    if (spans->empty()) return;
    events_.post([this, spans] {
      for (const Span& s : *spans) tracing_->deliver(s);
    });
  } catch (...) {  // no memory for the spans
  }
}

}  // namespace distlock::detail
