// Engine: where the spans of holds, renewals and losses are handed to the tracer
// (engine/trace_spans.hpp builds them). Losses and renewals are found on the renewer, the
// watchdog or a backend's thread: their spans are delivered on the event thread, so a
// slow tracer never delays a renewal or a loss signal.
#include <memory>
#include <vector>

#include "engine/engine.hpp"

namespace distlock::detail {

void Engine::trace_loss(const HeldLock& held, LossReason reason, const std::string& why,
                        Clock::time_point at) noexcept {
  try {
    const distlock::LossReason pub = public_loss_reason(reason);
    auto spans = std::make_shared<std::vector<Span>>();
    spans->push_back(tracing_->loss_span(held, pub, why, at));
    if (auto hold = tracing_->end_hold(held, SpanOutcome::lost, at, {}, pub, why))
      spans->push_back(std::move(*hold));
    events_.post([this, spans] {
      for (const Span& s : *spans) tracing_->deliver(s);
    });
  } catch (...) {  // no memory for the spans: the loss itself is signalled
  }
}

void Engine::trace_hold_end(const HeldLock& held, SpanOutcome outcome, Clock::time_point end,
                            const std::error_code& ec) noexcept {
  try {
    const bool lost = outcome == SpanOutcome::lost;
    std::optional<Span> s =
        tracing_->end_hold(held, outcome, end, ec, lost ? held.public_reason() : distlock::LossReason::none,
                           lost ? held.public_detail() : std::string());
    if (s) tracing_->deliver(*s);
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
