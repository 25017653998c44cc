// `distlock run`'s telemetry, set up before it connects: the --metrics-port endpoint (the
// client's metrics once connected) and the tracer of --trace-file / $TRACEPARENT.
#include <mutex>

#include "cli/metrics_http.hpp"
#include "cli/run/run.hpp"
#include "otlp_json_exporter.hpp"

namespace distlock::cli::run {

namespace {

/// What the metrics endpoint serves: the client's metrics once it is connected.
class MetricsSource {
 public:
  void set(const Client& c) {
    std::lock_guard lk(mu_);
    client_ = c;
  }
  std::string text() const {
    std::lock_guard lk(mu_);
    return client_ ? client_->metrics() : std::string();
  }

 private:
  mutable std::mutex mu_;
  std::optional<Client> client_;
};

/// Spans kept by nobody: with $TRACEPARENT but no --trace-file the runner still traces, so
/// that the job gets the hold span's context as its parent.
class UnexportedSpans final : public Tracer {
 public:
  void on_span(const Span&) noexcept override {}
};

}  // namespace

/// --metrics-port: serves the client's metrics from before it connects. -1, or the exit
/// status when the endpoint cannot be started.
int start_metrics(const RunSettings& s, std::unique_ptr<MetricsServer>& metrics,
                  std::function<void(const Client&)>& on_connected) {
  if (s.metrics_port < 0) return -1;
  auto source = std::make_shared<MetricsSource>();
  try {
    metrics = MetricsServer::start(s.metrics_addr, s.metrics_port, [source] { return source->text(); });
  } catch (const std::system_error& e) {
    print_error(e.what());
    return exit_code_for(e.code());
  }
  on_connected = [source](const Client& c) { source->set(c); };
  return -1;
}

/// --trace-file / $TRACEPARENT: the tracer, made before connecting. -1, or the exit status
/// when the trace file cannot be opened. A malformed $TRACEPARENT is ignored with a warning
/// (the library's own would be hidden unless DISTLOCK_LOG asks for it); the runner still
/// traces, so the job gets a well-formed TRACEPARENT (a new trace) instead of the bad one.
int start_tracing(RunSettings& s) {
  const bool traced = !s.trace_file.empty() || !s.traceparent.empty();
  if (!s.traceparent.empty()) {
    std::string why;
    if (!TraceContext::parse(s.traceparent, &why)) {
      print_error("warning: TRACEPARENT \"" + s.traceparent.substr(0, 64) + "\" ignored: " + why +
                  "; the runner's spans start a new trace");
      s.traceparent.clear();
    }
  }
  if (!traced) return -1;
  if (!s.trace_file.empty()) {
    try {
      s.tracer = std::make_shared<distlock_examples::OtlpJsonExporter>(s.trace_file, "distlock");
    } catch (const std::system_error& e) {
      print_error(std::string(e.what()) + " (--trace-file)");
      return exit_status::usage;
    }
  } else {
    s.tracer = std::make_shared<UnexportedSpans>();
  }
  return -1;
}

}  // namespace distlock::cli::run
