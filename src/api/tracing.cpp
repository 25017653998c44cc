// distlock/tracing.hpp: W3C traceparent parsing and formatting, random ids, names.
#include "distlock/tracing.hpp"

#include <algorithm>

#include "engine/owner_id.hpp"

namespace distlock {

namespace {

constexpr char kTraceHex[] = "0123456789abcdef";

int trace_hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase is not allowed by the W3C format
}

// Parses 2*N lowercase hex digits into `out`; false on any other character.
template <std::size_t N>
bool parse_trace_hex(std::string_view text, std::array<std::uint8_t, N>& out) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = trace_hex_digit(text[2 * i]), lo = trace_hex_digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}

template <std::size_t N>
std::string trace_hex(const std::array<std::uint8_t, N>& bytes) {
  std::string out;
  out.reserve(2 * N);
  for (const std::uint8_t b : bytes) {
    out.push_back(kTraceHex[b >> 4]);
    out.push_back(kTraceHex[b & 0xf]);
  }
  return out;
}

template <std::size_t N>
bool trace_all_zero(const std::array<std::uint8_t, N>& bytes) noexcept {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

bool trace_set_why(std::string* why, const char* text) {
  if (why) *why = text;
  return false;
}

}  // namespace

bool TraceContext::valid() const noexcept {
  return !trace_all_zero(trace_id) && !trace_all_zero(span_id);
}

std::optional<TraceContext> TraceContext::parse(std::string_view tp, std::string* why) {
  TraceContext c;
  std::array<std::uint8_t, 1> version{}, flags{};
  if (tp.size() != 55) {
    trace_set_why(why, "a traceparent is 55 characters: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>");
    return std::nullopt;
  }
  if (tp[2] != '-' || tp[35] != '-' || tp[52] != '-') {
    trace_set_why(why, "the fields of a traceparent are separated by '-' at offsets 2, 35 and 52");
    return std::nullopt;
  }
  if (!parse_trace_hex(tp.substr(0, 2), version) || !parse_trace_hex(tp.substr(3, 32), c.trace_id) ||
      !parse_trace_hex(tp.substr(36, 16), c.span_id) || !parse_trace_hex(tp.substr(53, 2), flags)) {
    trace_set_why(why, "a traceparent's fields are lowercase hex digits");
    return std::nullopt;
  }
  if (version[0] != 0) {
    trace_set_why(why, "only traceparent version 00 is supported");
    return std::nullopt;
  }
  if (trace_all_zero(c.trace_id)) {
    trace_set_why(why, "the trace id is all zeros");
    return std::nullopt;
  }
  if (trace_all_zero(c.span_id)) {
    trace_set_why(why, "the parent span id is all zeros");
    return std::nullopt;
  }
  c.flags = flags[0];
  return c;
}

TraceContext TraceContext::random() {
  TraceContext c;
  do {
    detail::random_bytes(c.trace_id.data(), c.trace_id.size());
  } while (trace_all_zero(c.trace_id));
  do {
    detail::random_bytes(c.span_id.data(), c.span_id.size());
  } while (trace_all_zero(c.span_id));
  c.flags = 0x01;
  return c;
}

TraceContext TraceContext::child() const {
  TraceContext c = *this;
  do {
    detail::random_bytes(c.span_id.data(), c.span_id.size());
  } while (trace_all_zero(c.span_id) || c.span_id == span_id);
  return c;
}

std::string TraceContext::traceparent() const {
  const std::array<std::uint8_t, 1> f{flags};
  return "00-" + trace_id_hex() + "-" + span_id_hex() + "-" + trace_hex(f);
}

std::string TraceContext::trace_id_hex() const {
  return trace_hex(trace_id);
}

std::string TraceContext::span_id_hex() const {
  return trace_hex(span_id);
}

const char* to_string(SpanKind kind) noexcept {
  switch (kind) {
    case SpanKind::wait: return "wait";
    case SpanKind::hold: return "hold";
    case SpanKind::renewal: return "renewal";
    case SpanKind::loss: return "loss";
  }
  return "unknown";
}

const char* to_string(SpanOutcome outcome) noexcept {
  switch (outcome) {
    case SpanOutcome::acquired: return "acquired";
    case SpanOutcome::busy: return "busy";
    case SpanOutcome::timed_out: return "timed_out";
    case SpanOutcome::cancelled: return "cancelled";
    case SpanOutcome::error: return "error";
    case SpanOutcome::released: return "released";
    case SpanOutcome::lost: return "lost";
    case SpanOutcome::renewed: return "renewed";
    case SpanOutcome::refused: return "refused";
    case SpanOutcome::failed: return "failed";
  }
  return "unknown";
}

Tracer::~Tracer() = default;

}  // namespace distlock
