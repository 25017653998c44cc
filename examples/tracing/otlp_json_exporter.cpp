// otlp_json_exporter.cpp — see otlp_json_exporter.hpp.
#include "otlp_json_exporter.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <system_error>

#include "distlock/version.hpp"

namespace distlock_examples {

namespace {

using nlohmann::json;

json otlp_string(std::string_view key, std::string_view value) {
  return json{{"key", key}, {"value", {{"stringValue", value}}}};
}

// OTLP/JSON writes 64-bit integers as decimal strings.
json otlp_int(std::string_view key, std::uint64_t value) {
  return json{{"key", key}, {"value", {{"intValue", std::to_string(value)}}}};
}

std::string otlp_unix_nano(std::chrono::system_clock::time_point t) {
  return std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

std::string otlp_hex(const std::array<std::uint8_t, 8>& id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const std::uint8_t b : id) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

bool otlp_is_error(const distlock::Span& s) {
  using distlock::SpanOutcome;
  return s.outcome == SpanOutcome::error || s.outcome == SpanOutcome::lost ||
         s.outcome == SpanOutcome::refused || s.outcome == SpanOutcome::failed;
}

}  // namespace

OtlpJsonExporter::OtlpJsonExporter(const std::string& path, std::string service_name)
    : service_(std::move(service_name)), path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "cannot open trace file " + path);
}

OtlpJsonExporter::~OtlpJsonExporter() {
  if (fd_ >= 0) ::close(fd_);
}

std::string OtlpJsonExporter::to_json_line(const distlock::Span& s, std::string_view service_name) {
  json attrs = json::array();
  attrs.push_back(otlp_string("distlock.lock.name", s.lock_name));
  attrs.push_back(otlp_string("distlock.backend", s.backend));
  attrs.push_back(otlp_string("distlock.outcome", distlock::to_string(s.outcome)));
  if (!s.owner.empty()) attrs.push_back(otlp_string("distlock.owner", s.owner));
  if (!s.holder_info.empty()) attrs.push_back(otlp_string("distlock.holder_info", s.holder_info));
  if (s.token) attrs.push_back(otlp_int("distlock.token", *s.token));
  if (s.loss_reason != distlock::LossReason::none) {
    attrs.push_back(otlp_string("distlock.loss_reason", distlock::to_string(s.loss_reason)));
  }
  if (s.batch_size > 0) attrs.push_back(otlp_int("distlock.batch_size", s.batch_size));
  if (!s.detail.empty()) attrs.push_back(otlp_string("distlock.detail", s.detail));
  if (s.error) attrs.push_back(otlp_string("error.type", s.error.message()));

  json span = {
      {"traceId", s.context.trace_id_hex()},
      {"spanId", s.context.span_id_hex()},
      {"name", s.name},
      {"kind", 1},  // SPAN_KIND_INTERNAL
      {"startTimeUnixNano", otlp_unix_nano(s.start_wall)},
      {"endTimeUnixNano", otlp_unix_nano(s.end_wall)},
      {"attributes", attrs},
      {"status", otlp_is_error(s) ? json{{"code", 2}, {"message", s.detail}} : json::object()},
  };
  if (s.parent_span_id != std::array<std::uint8_t, 8>{}) span["parentSpanId"] = otlp_hex(s.parent_span_id);
  if (s.context.flags != 0) span["flags"] = s.context.flags;

  const json request = {
      {"resourceSpans",
       json::array({{
           {"resource", {{"attributes", json::array({otlp_string("service.name", service_name)})}}},
           {"scopeSpans", json::array({{
                              {"scope", {{"name", "distlock"}, {"version", distlock::kVersion}}},
                              {"spans", json::array({span})},
                          }})},
       }})},
  };
  return request.dump(-1, ' ', false, json::error_handler_t::replace);
}

void OtlpJsonExporter::on_span(const distlock::Span& span) noexcept {
  int err = 0;
  try {
    std::string line = to_json_line(span, service_);
    line.push_back('\n');
    const ssize_t n = ::write(fd_, line.data(), line.size());  // O_APPEND: one line, whole
    if (n < 0)
      err = errno;
    else if (static_cast<std::size_t>(n) != line.size())
      err = ENOSPC;
  } catch (...) {
    err = ENOMEM;
  }
  if (err == 0) return;
  std::lock_guard lk(mu_);
  if (warned_) return;
  warned_ = true;
  std::fprintf(stderr, "distlock: spans not written to trace file %s: %s\n", path_.c_str(),
               std::generic_category().message(err).c_str());
}

}  // namespace distlock_examples
