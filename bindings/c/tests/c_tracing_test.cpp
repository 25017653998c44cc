// Tracing through the C API (include/distlock/distlock.h, docs/c.md): distlock_connect_traced
// hands a distlock_span per span to a C callback; distlock_acquire_traced gives one lock a
// parent traceparent; distlock_lease_traceparent is the hold span's. On file:// in a
// temporary directory (no server to start); the spans themselves are tested for every
// backend in tests/engine/engine_tracing_test.cpp.
#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.h"
#include "support/process.hpp"

namespace {

using distlock::testing::TempDir;

constexpr const char* kParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// A copy of what the callback was given (its pointers live for the call only).
struct CopiedSpan {
  int kind = -1;
  std::string name, trace_id, span_id, parent_span_id, traceparent, lock_name, owner, holder_info, backend,
      outcome, loss_reason, detail;
  int sampled = 0, has_token = 0, error_code = 0;
  std::int64_t start_unix_ns = 0, end_unix_ns = 0, start_mono_ns = 0, end_mono_ns = 0;
};

struct Collected {
  std::atomic<int> released{0};
  std::size_t spans_at_release = 0;  // under mu
  std::mutex mu;
  std::vector<CopiedSpan> spans;
  std::vector<CopiedSpan> of(int kind) {
    std::lock_guard lk(mu);
    std::vector<CopiedSpan> out;
    for (const auto& s : spans)
      if (s.kind == kind) out.push_back(s);
    return out;
  }
};

extern "C" void collect_span(const distlock_span* s, void* user) {
  auto* c = static_cast<Collected*>(user);
  CopiedSpan x;
  x.kind = s->kind;
  x.name = s->name;
  x.trace_id = s->trace_id;
  x.span_id = s->span_id;
  x.parent_span_id = s->parent_span_id;
  x.traceparent = s->traceparent;
  x.lock_name = s->lock_name;
  x.owner = s->owner;
  x.holder_info = s->holder_info;
  x.backend = s->backend;
  x.outcome = s->outcome;
  x.loss_reason = s->loss_reason;
  x.detail = s->detail;
  x.sampled = s->sampled;
  x.has_token = s->has_token;
  x.error_code = s->error_code;
  x.start_unix_ns = s->start_unix_ns;
  x.end_unix_ns = s->end_unix_ns;
  x.start_mono_ns = s->start_mono_ns;
  x.end_mono_ns = s->end_mono_ns;
  std::lock_guard lk(c->mu);
  c->spans.push_back(std::move(x));
}

std::int64_t boottime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::int64_t unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct ClientDeleter {
  void operator()(distlock_client* c) const { distlock_client_close(c); }
};
using ClientPtr = std::unique_ptr<distlock_client, ClientDeleter>;

ClientPtr connect_traced(const std::string& url, Collected& sink, const char* traceparent) {
  distlock_client* c = nullptr;
  distlock_error err{};
  EXPECT_EQ(
      distlock_connect_traced(url.c_str(), nullptr, collect_span, &sink, nullptr, traceparent, &c, &err),
      DISTLOCK_OK)
      << err.message;
  return ClientPtr(c);
}

TEST(CApiTracing, WaitAndHoldSpansReachTheCallbackWithTheCallersTraceparent) {
  TempDir dir("distlock-ctrace");
  Collected sink;
  ClientPtr client = connect_traced("file://" + dir.path().string(), sink, nullptr);
  ASSERT_NE(client, nullptr);
  distlock_error err{};
  distlock_lease* lease = nullptr;
  const std::int64_t mono0 = boottime_ns(), unix0 = unix_ns();
  ASSERT_EQ(distlock_acquire_traced(client.get(), "jobs/c", nullptr, kParent, &lease, &err), DISTLOCK_OK)
      << err.message;
  char* tp = nullptr;
  ASSERT_EQ(distlock_lease_traceparent(lease, &tp, &err), DISTLOCK_OK) << err.message;
  ASSERT_NE(tp, nullptr);
  const std::string lease_tp = tp;
  distlock_string_free(tp);
  ASSERT_EQ(distlock_lease_release(lease, &err), DISTLOCK_OK) << err.message;
  distlock_lease_free(lease);
  const std::int64_t mono1 = boottime_ns(), unix1 = unix_ns();

  const auto waits = sink.of(DISTLOCK_SPAN_WAIT);
  const auto holds = sink.of(DISTLOCK_SPAN_HOLD);
  ASSERT_EQ(waits.size(), 1u);
  ASSERT_EQ(holds.size(), 1u);
  const CopiedSpan& w = waits[0];
  const CopiedSpan& h = holds[0];
  EXPECT_EQ(w.name, "distlock.wait");
  EXPECT_EQ(h.name, "distlock.hold");
  EXPECT_EQ(w.outcome, "acquired");
  EXPECT_EQ(h.outcome, "released");
  EXPECT_EQ(h.loss_reason, "none");
  EXPECT_EQ(w.lock_name, "jobs/c");
  EXPECT_EQ(h.lock_name, "jobs/c");
  EXPECT_EQ(h.backend, "file");
  EXPECT_FALSE(h.owner.empty());
  EXPECT_EQ(h.has_token, 1);  // file:// issues fencing tokens
  // The caller's traceparent is the parent of both; one trace.
  EXPECT_EQ(w.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(h.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(w.parent_span_id, "00f067aa0ba902b7");
  EXPECT_EQ(h.parent_span_id, "00f067aa0ba902b7");
  EXPECT_EQ(w.span_id.size(), 16u);
  EXPECT_NE(w.span_id, h.span_id);
  EXPECT_EQ(h.traceparent, "00-" + h.trace_id + "-" + h.span_id + "-01");
  EXPECT_EQ(h.sampled, 1);
  EXPECT_EQ(lease_tp, h.traceparent);  // the lease's traceparent is the hold span's
  // Times: within the calls, on both clocks.
  for (const CopiedSpan* s : {&w, &h}) {
    EXPECT_LE(mono0, s->start_mono_ns);
    EXPECT_LE(s->start_mono_ns, s->end_mono_ns);
    EXPECT_LE(s->end_mono_ns, mono1);
    EXPECT_LE(unix0 - 1'000'000, s->start_unix_ns);  // 1 ms: the two clocks are read apart
    EXPECT_LE(s->end_unix_ns, unix1 + 1'000'000);
    EXPECT_EQ(s->end_unix_ns - s->start_unix_ns, s->end_mono_ns - s->start_mono_ns);
  }
}

TEST(CApiTracing, ABusyWaitIsAWaitSpanWithItsErrorCodeAndARootWithoutTraceparent) {
  TempDir dir("distlock-ctrace");
  Collected sink;
  const std::string url = "file://" + dir.path().string();
  ClientPtr holder = connect_traced(url, sink, nullptr);
  ClientPtr other = connect_traced(url, sink, nullptr);
  distlock_error err{};
  distlock_lease* held = nullptr;
  ASSERT_EQ(distlock_acquire(holder.get(), "jobs/busy", nullptr, &held, &err), DISTLOCK_OK) << err.message;
  distlock_lease* none = nullptr;
  EXPECT_EQ(distlock_try_acquire(other.get(), "jobs/busy", nullptr, &none, &err), DISTLOCK_E_BUSY);
  EXPECT_EQ(none, nullptr);
  distlock_lease_free(held);
  std::vector<CopiedSpan> busy;
  for (const auto& w : sink.of(DISTLOCK_SPAN_WAIT))
    if (w.outcome == "busy") busy.push_back(w);
  ASSERT_EQ(busy.size(), 1u);
  EXPECT_EQ(busy[0].error_code, DISTLOCK_E_BUSY);
  EXPECT_EQ(busy[0].parent_span_id, "");  // a root: no traceparent given
  EXPECT_EQ(busy[0].trace_id.size(), 32u);
}

TEST(CApiTracing, MalformedTraceparentsAreIgnoredAndTheLockCallSucceeds) {
  TempDir dir("distlock-ctrace");
  Collected sink;
  // The client's is malformed too: connect succeeds.
  ClientPtr client = connect_traced("file://" + dir.path().string(), sink, "not-a-traceparent");
  ASSERT_NE(client, nullptr);
  const char* bad[] = {
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // uppercase
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
      "00-00000000000000000000000000000000-0000000000000000-01",  // zero ids
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",   // one character short
  };
  for (const char* tp : bad) {
    distlock_error err{};
    distlock_lease* lease = nullptr;
    ASSERT_EQ(distlock_acquire_traced(client.get(), "jobs/bad", nullptr, tp, &lease, &err), DISTLOCK_OK)
        << tp << ": " << err.message;
    EXPECT_EQ(distlock_lease_release(lease, &err), DISTLOCK_OK) << err.message;
    distlock_lease_free(lease);
  }
  const auto waits = sink.of(DISTLOCK_SPAN_WAIT);
  ASSERT_EQ(waits.size(), 4u);
  for (const auto& w : waits) {
    EXPECT_EQ(w.parent_span_id, "");  // ignored: a root
    EXPECT_NE(w.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  }
}

extern "C" void count_release(void* user) {
  auto* c = static_cast<Collected*>(user);
  {
    std::lock_guard lk(c->mu);
    c->spans_at_release = c->spans.size();
  }
  c->released.fetch_add(1);
}

// user_data is released once, when no span can come any more: not at distlock_client_close
// while a lease lives (its release still gives a hold span), but once that lease is
// released (the engine goes with its last lease) or, at the latest, freed.
TEST(CApiTracing, UserDataIsReleasedOnceAfterTheCloseAndTheLastLease) {
  TempDir dir("distlock-ctrace");
  Collected sink;
  distlock_client* c = nullptr;
  distlock_error err{};
  ASSERT_EQ(distlock_connect_traced(("file://" + dir.path().string()).c_str(), nullptr, collect_span, &sink,
                                    count_release, nullptr, &c, &err),
            DISTLOCK_OK)
      << err.message;
  distlock_lease* lease = nullptr;
  ASSERT_EQ(distlock_acquire(c, "jobs/after-close", nullptr, &lease, &err), DISTLOCK_OK) << err.message;
  distlock_client_close(c);
  EXPECT_EQ(sink.released.load(), 0);
  ASSERT_EQ(distlock_lease_release(lease, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(sink.of(DISTLOCK_SPAN_HOLD).size(), 1u);  // the tracer still gets it
  distlock_lease_free(lease);
  EXPECT_EQ(sink.released.load(), 1);
  {
    std::lock_guard lk(sink.mu);
    EXPECT_EQ(sink.spans_at_release, 2u);  // the wait and the hold: released after the last span
  }
  // A failed connect releases it too.
  Collected other;
  distlock_client* none = nullptr;
  EXPECT_NE(distlock_connect_traced("nosuchscheme://x", nullptr, collect_span, &other, count_release, nullptr,
                                    &none, &err),
            DISTLOCK_OK);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(other.released.load(), 1);
}

TEST(CApiTracing, WithoutATracerTheLeaseHasNoTraceparent) {
  TempDir dir("distlock-ctrace");
  distlock_client* raw = nullptr;
  distlock_error err{};
  ASSERT_EQ(distlock_connect(("file://" + dir.path().string()).c_str(), nullptr, &raw, &err), DISTLOCK_OK);
  ClientPtr client(raw);
  distlock_lease* lease = nullptr;
  ASSERT_EQ(distlock_acquire_traced(client.get(), "jobs/untraced", nullptr, kParent, &lease, &err),
            DISTLOCK_OK);
  char* tp = reinterpret_cast<char*>(1);
  EXPECT_EQ(distlock_lease_traceparent(lease, &tp, &err), DISTLOCK_OK);
  EXPECT_EQ(tp, nullptr);
  distlock_lease_free(lease);
}

}  // namespace
