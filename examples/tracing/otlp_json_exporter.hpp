// otlp_json_exporter.hpp — a distlock::Tracer that writes OTLP/JSON lines.
//
// Each span becomes one line: an ExportTraceServiceRequest-shaped JSON object
// (resourceSpans / scopeSpans / spans with traceId, spanId, parentSpanId, name, kind,
// startTimeUnixNano, endTimeUnixNano, attributes, status), as the OpenTelemetry
// collector's file exporter writes them, so the file can be read by its file receiver or
// any tool that reads OTLP/JSON. The `distlock` tool uses it for `run --trace-file`.
//
// Attributes: distlock.lock.name, distlock.backend, distlock.outcome, distlock.owner,
// distlock.holder_info, distlock.token, distlock.loss_reason, distlock.batch_size,
// distlock.detail, error.type (each only when it has a value). Status ERROR for a wait that
// ended in an error, a hold that was lost or whose release failed, a loss, and a renewal
// that was refused or failed.
//
// Thread-safety: on_span may be called from any thread at once; each line is written with
// one write() to a file opened with O_APPEND, so processes sharing the file do not
// interleave lines.
//
// Example:
//   auto exporter = std::make_shared<distlock_examples::OtlpJsonExporter>("/tmp/spans.jsonl");
//   distlock::ClientOptions options;
//   options.tracer = exporter;
//   auto client = distlock::connect("file:///tmp/locks", options);
#pragma once

#include <mutex>
#include <string>
#include <string_view>

#include "distlock/tracing.hpp"

namespace distlock_examples {

class OtlpJsonExporter final : public distlock::Tracer {
 public:
  /// Opens `path` for appending (created 0644). Throws std::system_error naming the path.
  explicit OtlpJsonExporter(const std::string& path, std::string service_name = "distlock");
  ~OtlpJsonExporter() override;
  OtlpJsonExporter(const OtlpJsonExporter&) = delete;
  OtlpJsonExporter& operator=(const OtlpJsonExporter&) = delete;

  void on_span(const distlock::Span& span) noexcept override;

  /// The line for `span` (without the newline).
  static std::string to_json_line(const distlock::Span& span, std::string_view service_name);

 private:
  int fd_ = -1;
  std::string service_;
  std::string path_;
  std::mutex mu_;  // one warning for a failed write
  bool warned_ = false;
};

}  // namespace distlock_examples
