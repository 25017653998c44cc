// trace_locks: takes a lock with tracing on and writes its spans as OTLP/JSON lines.
//
//   trace_locks URL NAME TRACE_FILE HOLD_MS
//
// The parent of the wait and hold spans is $TRACEPARENT when it is set (a malformed one is
// ignored with a warning). Prints the hold span's traceparent, holds the lock HOLD_MS
// milliseconds (renewed meanwhile), releases it, and exits 0; the spans are then in
// TRACE_FILE, one ExportTraceServiceRequest per line (otlp_json_exporter.hpp).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "otlp_json_exporter.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: trace_locks URL NAME TRACE_FILE HOLD_MS\n");
    return 64;
  }
  try {
    distlock::ClientOptions options;
    options.tracer = std::make_shared<distlock_examples::OtlpJsonExporter>(argv[3], "trace_locks");
    if (const char* tp = std::getenv("TRACEPARENT")) options.traceparent = tp;
    distlock::Client client = distlock::connect(argv[1], options);
    distlock::LockOptions lock;
    lock.ttl = std::chrono::seconds(3);
    distlock::Lease lease = client.acquire(argv[2], lock);
    if (auto ctx = lease.trace_context()) std::printf("hold %s\n", ctx->traceparent().c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(argv[4])));
    lease.release();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trace_locks: %s\n", e.what());
    return 1;
  }
}
