// `distlock run` and W3C trace context (docs/tracing.md), on file:// and on a redis-server
// the test starts: $TRACEPARENT is the parent of the runner's wait and hold spans, the job
// gets the hold span's context as its TRACEPARENT, --trace-file holds the spans as OTLP/JSON
// lines, and a malformed TRACEPARENT is ignored with a warning while the run goes on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_fixture.hpp"
#include "cli/cli_harness.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr const char* kParentTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr const char* kParentSpan = "00f067aa0ba902b7";

/// The spans of an OTLP/JSON lines file, by name ("distlock.wait", ...); fails the test on a
/// line that is not one ExportTraceServiceRequest with one span.
std::multimap<std::string, json> spans_of(const std::filesystem::path& file) {
  std::multimap<std::string, json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const json req = json::parse(line);
    const json& rs = req.at("resourceSpans").at(0);
    EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("key"), "service.name");
    const json& span = rs.at("scopeSpans").at(0).at("spans").at(0);
    out.emplace(span.at("name").get<std::string>(), span);
  }
  return out;
}

std::string attribute(const json& span, const std::string& key) {
  for (const json& a : span.at("attributes")) {
    if (a.at("key") == key) {
      const json& v = a.at("value");
      return v.contains("stringValue") ? v.at("stringValue").get<std::string>()
                                       : v.at("intValue").get<std::string>();
    }
  }
  return "";
}

std::uint64_t nanos(const json& span, const char* field) {
  return std::stoull(span.at(field).get<std::string>());
}

class CliTracing : public FileOrRedisCliTest {
 protected:
  CliTracing() : FileOrRedisCliTest("distlock-cli-tracing") {}
  void SetUp() override {
    FileOrRedisCliTest::SetUp();
    ::unsetenv("TRACEPARENT");  // only what a test gives the runner
  }
  /// Runs a job that writes its TRACEPARENT to job_tp and sleeps 0.2 s; the exit status.
  int run_job(const std::vector<std::string>& env, std::string& err) {
    Cli c =
        Cli::run(run_sh("traced/job",
                        "printf '%s' \"${TRACEPARENT-unset}\" > " + path("job_tp").string() + "; sleep 0.2",
                        {"--ttl", "3s", "--trace-file", path("spans.jsonl").string()}),
                 dir_.path(), 20s, env);
    err = c.err();
    return c.code();
  }
};

TEST_P(CliTracing, TheJobSeesAChildOfTheRunnersTraceparentAndTheTraceFileHasTheSpans) {
  std::string err;
  ASSERT_EQ(run_job({std::string("TRACEPARENT=00-") + kParentTrace + "-" + kParentSpan + "-01"}, err), 0)
      << err;
  EXPECT_EQ(err, "");
  const std::string job_tp = slurp(path("job_tp"));
  ASSERT_EQ(job_tp.size(), 55u) << job_tp;
  EXPECT_EQ(job_tp.substr(0, 3), "00-");
  EXPECT_EQ(job_tp.substr(3, 32), kParentTrace);  // the parent's trace
  EXPECT_NE(job_tp.substr(36, 16), kParentSpan);  // a span of its own
  EXPECT_EQ(job_tp.substr(52), "-01");

  const auto spans = spans_of(path("spans.jsonl"));
  ASSERT_EQ(spans.count("distlock.wait"), 1u);
  ASSERT_EQ(spans.count("distlock.hold"), 1u);
  const json& wait = spans.find("distlock.wait")->second;
  const json& hold = spans.find("distlock.hold")->second;
  for (const json* s : {&wait, &hold}) {
    EXPECT_EQ(s->at("traceId"), kParentTrace);
    EXPECT_EQ(s->at("parentSpanId"), kParentSpan);
    EXPECT_EQ(attribute(*s, "distlock.lock.name"), "traced/job");
    EXPECT_EQ(attribute(*s, "distlock.backend"), redis() ? "redis" : "file");
  }
  EXPECT_EQ(attribute(wait, "distlock.outcome"), "acquired");
  EXPECT_EQ(attribute(hold, "distlock.outcome"), "released");
  EXPECT_FALSE(attribute(hold, "distlock.token").empty());
  // The job's parent is the hold span.
  EXPECT_EQ(hold.at("spanId"), job_tp.substr(36, 16));
  // The hold covers the job's 0.2 s sleep, and begins where the wait ends.
  EXPECT_GE(nanos(hold, "endTimeUnixNano") - nanos(hold, "startTimeUnixNano"), 200'000'000u);
  EXPECT_EQ(nanos(wait, "endTimeUnixNano"), nanos(hold, "startTimeUnixNano"));
}

TEST_P(CliTracing, AMalformedTraceparentIsIgnoredWithAWarningAndTheRunGoesOn) {
  std::string err;
  ASSERT_EQ(run_job({"TRACEPARENT=00-not-a-trace-context"}, err), 0) << err;
  EXPECT_NE(
      err.find("warning: TRACEPARENT \"00-not-a-trace-context\" ignored: a traceparent is 55 characters"),
      std::string::npos)
      << err;
  const std::string job_tp = slurp(path("job_tp"));
  ASSERT_EQ(job_tp.size(), 55u) << job_tp;  // a new trace, whose root is the runner's
  const auto spans = spans_of(path("spans.jsonl"));
  ASSERT_EQ(spans.count("distlock.hold"), 1u);
  const json& hold = spans.find("distlock.hold")->second;
  EXPECT_FALSE(hold.contains("parentSpanId"));
  EXPECT_EQ(hold.at("traceId"), job_tp.substr(3, 32));
  EXPECT_EQ(hold.at("spanId"), job_tp.substr(36, 16));
}

TEST_P(CliTracing, WithoutTraceparentOrTraceFileTheJobGetsNoTraceparent) {
  Cli c =
      Cli::run(run_sh("traced/plain", "printf '%s' \"${TRACEPARENT-unset}\" > " + path("job_tp").string()),
               dir_.path(), 20s);
  ASSERT_EQ(c.code(), 0) << c.err();
  EXPECT_EQ(slurp(path("job_tp")), "unset");
}

TEST_P(CliTracing, ATraceFileThatCannotBeOpenedIsAUsageErrorNamingIt) {
  const std::string bad = (path("no-such-dir") / "spans.jsonl").string();
  Cli c = Cli::run(run_sh("traced/bad", "true", {"--trace-file", bad}), dir_.path(), 20s);
  EXPECT_EQ(c.code(), 64);
  EXPECT_NE(c.err().find("cannot open trace file " + bad), std::string::npos) << c.err();
}

// --- Several locks: `distlock run --lock A --lock B` (src/cli/run/multi_hold.hpp) ---

/// The spans of `kind` ("distlock.wait", ...) by lock name; fails on a name seen twice.
std::map<std::string, json> by_lock(const std::multimap<std::string, json>& spans, const std::string& kind) {
  std::map<std::string, json> out;
  const auto [from, to] = spans.equal_range(kind);
  for (auto it = from; it != to; ++it) {
    EXPECT_TRUE(out.emplace(attribute(it->second, "distlock.lock.name"), it->second).second)
        << kind << " twice for " << attribute(it->second, "distlock.lock.name");
  }
  return out;
}

bool fs_remove(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::remove(p, ec);
}

/// Wall-clock times of different spans, and the job's `date` readings, are compared with this
/// slack: the engine reads a span's wall start a moment after its steady start (begin_wait after
/// the acquire call's clock reading) and derives the rest from steady durations, so a thread
/// preempted between the two readings shifts that span's wall times later (the set span's likewise;
/// seen: 0.95 ms at a load average of 8 on 2 cores). 50 ms covers a preemption of the runner under CI load;
/// durations are checked exactly.
constexpr std::uint64_t kWallSlackNs = 50'000'000;

class CliTracingLocks : public CliTracing {
 protected:
  static inline const std::vector<std::string> kNames{"set/c", "set/a", "set/b"};  // given unsorted

  /// `distlock run --trace-file spans.jsonl --lock set/c --lock set/a --lock set/b -- sh -c ...`:
  /// the job writes its TRACEPARENT, DISTLOCK_TOKENS and its start and end on the wall clock
  /// (`date +%s%N`, around a 0.2-s sleep). The exit status; `took`: the run on this process's
  /// steady clock, from before the runner is started to after it is reaped.
  int run_set(const std::vector<std::string>& env, std::string& err, std::chrono::nanoseconds& took) {
    std::vector<std::string> args{
        "run", "--url", url_, "--ttl", "3s", "--trace-file", path("spans.jsonl").string()};
    for (const auto& n : kNames) args.insert(args.end(), {"--lock", n});
    const std::string job = "date +%s%N > " + path("job_start").string() +
                            "; printf '%s' \"${TRACEPARENT-unset}\" > " + path("job_tp").string() +
                            "; printf '%s' \"$DISTLOCK_TOKENS\" > " + path("job_tokens").string() +
                            "; sleep 0.2; date +%s%N > " + path("job_end").string();
    args.insert(args.end(), {"--", "sh", "-c", job});
    const auto before = std::chrono::steady_clock::now();
    Cli c = Cli::run(args, dir_.path(), 20s, env);
    took = std::chrono::steady_clock::now() - before;
    err = c.err();
    return c.code();
  }

  /// Checks what every run of a set must give, whoever the parent: one wait and one hold span per
  /// name with its name and its token from $DISTLOCK_TOKENS, all children of the one set span
  /// (`distlock.lock_set`), which is the job's TRACEPARENT; the holds and the set span cover the
  /// job's run (its `date` readings) and last no longer than the run measured by the test.
  /// Returns the set span.
  json expect_set_spans(std::chrono::nanoseconds took) {
    const std::string job_tp = slurp(path("job_tp"));
    EXPECT_EQ(job_tp.size(), 55u) << job_tp;
    const auto spans = spans_of(path("spans.jsonl"));
    EXPECT_EQ(spans.count("distlock.lock_set"), 1u);
    EXPECT_EQ(spans.count("distlock.wait"), 3u);
    EXPECT_EQ(spans.count("distlock.hold"), 3u);
    if (spans.count("distlock.lock_set") != 1 || job_tp.size() != 55) return json();
    const json set = spans.find("distlock.lock_set")->second;
    EXPECT_EQ(attribute(set, "distlock.lock.name"), "set/a,set/b,set/c");  // sorted
    EXPECT_EQ(attribute(set, "distlock.outcome"), "released");
    EXPECT_EQ(attribute(set, "distlock.backend"), redis() ? "redis" : "file");
    // The job's parent is the set span.
    EXPECT_EQ(job_tp.substr(3, 32), set.at("traceId"));
    EXPECT_EQ(job_tp.substr(36, 16), set.at("spanId"));
    EXPECT_EQ(job_tp.substr(52), "-01");

    // $DISTLOCK_TOKENS: "set/a=1,set/b=1,set/c=1".
    std::map<std::string, std::string> tokens;
    std::stringstream in(slurp(path("job_tokens")));
    for (std::string kv; std::getline(in, kv, ',');)
      tokens[kv.substr(0, kv.rfind('='))] = kv.substr(kv.rfind('=') + 1);
    EXPECT_EQ(tokens.size(), 3u) << slurp(path("job_tokens"));

    const std::uint64_t set_start = nanos(set, "startTimeUnixNano"), set_end = nanos(set, "endTimeUnixNano");
    const std::uint64_t job_start = std::stoull(slurp(path("job_start"))),
                        job_end = std::stoull(slurp(path("job_end")));
    const auto waits = by_lock(spans, "distlock.wait");
    const auto holds = by_lock(spans, "distlock.hold");
    for (const std::string name : {"set/a", "set/b", "set/c"}) {
      SCOPED_TRACE(name);
      EXPECT_EQ(waits.count(name), 1u);
      EXPECT_EQ(holds.count(name), 1u);
      if (waits.count(name) != 1 || holds.count(name) != 1) continue;
      const json& wait = waits.at(name);
      const json& hold = holds.at(name);
      for (const json* s : {&wait, &hold}) {
        EXPECT_EQ(s->at("traceId"), set.at("traceId"));
        EXPECT_EQ(s->value("parentSpanId", ""), set.at("spanId"));
        EXPECT_EQ(attribute(*s, "distlock.backend"), redis() ? "redis" : "file");
      }
      EXPECT_EQ(attribute(wait, "distlock.outcome"), "acquired");
      EXPECT_EQ(attribute(hold, "distlock.outcome"), "released");
      EXPECT_EQ(attribute(hold, "distlock.token"), tokens[name]);
      EXPECT_FALSE(tokens[name].empty());
      // The wait and the hold of each name lie inside the set span; the hold begins where the
      // wait ends, and covers the job's whole run.
      EXPECT_EQ(nanos(wait, "endTimeUnixNano"), nanos(hold, "startTimeUnixNano"));
      EXPECT_GE(nanos(wait, "startTimeUnixNano") + kWallSlackNs, set_start);
      EXPECT_LE(nanos(hold, "endTimeUnixNano"), set_end + kWallSlackNs);
      EXPECT_LE(nanos(hold, "startTimeUnixNano"), job_start + kWallSlackNs);
      EXPECT_GE(nanos(hold, "endTimeUnixNano") + kWallSlackNs, job_end);
      EXPECT_GE(nanos(hold, "endTimeUnixNano") - nanos(hold, "startTimeUnixNano"), 200'000'000u);
    }
    // The set span covers the job's 0.2-s sleep and lasts no longer than the whole run as the
    // test measured it on its own steady clock.
    EXPECT_LE(set_start, job_start + kWallSlackNs);
    EXPECT_GE(set_end + kWallSlackNs, job_end);
    EXPECT_GE(set_end - set_start, 200'000'000u);
    EXPECT_LE(set_end - set_start, static_cast<std::uint64_t>(took.count()));
    std::printf("%s: set span %.1f ms, job %.1f ms, run measured %.1f ms\n", GetParam().c_str(),
                (set_end - set_start) / 1e6, (job_end - job_start) / 1e6, took.count() / 1e6);
    return set;
  }
};

TEST_P(CliTracingLocks, EveryNamesWaitAndHoldAreChildrenOfTheSetSpanWhichIsTheJobsParent) {
  std::string err;
  std::chrono::nanoseconds took{};
  ASSERT_EQ(run_set({std::string("TRACEPARENT=00-") + kParentTrace + "-" + kParentSpan + "-01"}, err, took),
            0)
      << err;
  EXPECT_EQ(err, "");
  const json set = expect_set_spans(took);
  ASSERT_FALSE(set.is_null());
  EXPECT_EQ(set.at("traceId"), kParentTrace);  // the runner's TRACEPARENT is the set span's parent
  EXPECT_EQ(set.at("parentSpanId"), kParentSpan);
  EXPECT_EQ(slurp(path("job_tp")).substr(3, 32), kParentTrace);
}

TEST_P(CliTracingLocks, WithoutTraceparentEveryNamesSpansShareTheSetSpansNewTrace) {
  std::string err;
  std::chrono::nanoseconds took{};
  ASSERT_EQ(run_set({}, err, took), 0) << err;
  EXPECT_EQ(err, "");
  const json set = expect_set_spans(took);
  ASSERT_FALSE(set.is_null());
  EXPECT_FALSE(set.contains("parentSpanId"));  // the root of a new trace, which every span shares
}

// A set that cannot be taken: its span ends with the wait's outcome, and the spans of the names
// it took and gave back are its children.
TEST_P(CliTracingLocks, ASetRefusedWithNoWaitHasABusySetSpanOverItsNamesSpans) {
  const auto ready = path("holder-ready"), go = path("holder-go");
  Cli holder = Cli::start(run_sh("set/b", "echo x > " + ready.string() + "; while [ ! -e " + go.string() +
                                              " ]; do sleep 0.02; done"),
                          dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << holder.err();
  std::vector<std::string> args{"run",       "--url",        url_,
                                "--no-wait", "--trace-file", path("spans.jsonl").string()};
  for (const auto& n : kNames) args.insert(args.end(), {"--lock", n});
  args.insert(args.end(), {"--", "true"});
  Cli refused = Cli::run(args, dir_.path(), 20s);
  EXPECT_EQ(refused.code(), 75) << refused.err();
  std::FILE* f = std::fopen(go.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(holder.wait(20s), 0) << holder.err();

  const auto spans = spans_of(path("spans.jsonl"));
  ASSERT_EQ(spans.count("distlock.lock_set"), 1u);
  const json& set = spans.find("distlock.lock_set")->second;
  EXPECT_EQ(attribute(set, "distlock.outcome"), "busy");
  EXPECT_FALSE(set.contains("parentSpanId"));
  const auto waits = by_lock(spans, "distlock.wait");
  const auto holds = by_lock(spans, "distlock.hold");
  // Sorted order: set/a taken (and given back), set/b busy, set/c never tried.
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(attribute(waits.at("set/a"), "distlock.outcome"), "acquired");
  EXPECT_EQ(attribute(waits.at("set/b"), "distlock.outcome"), "busy");
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(attribute(holds.at("set/a"), "distlock.outcome"), "released");
  for (const json* s : {&waits.at("set/a"), &waits.at("set/b"), &holds.at("set/a")}) {
    EXPECT_EQ(s->at("traceId"), set.at("traceId"));
    EXPECT_EQ(s->value("parentSpanId", ""), set.at("spanId"));
    EXPECT_LE(nanos(*s, "endTimeUnixNano"), nanos(set, "endTimeUnixNano") + kWallSlackNs);
  }
}

// The loss of one name (file://: its lock file removed; redis://: `distlock revoke` of it) makes
// the set span `lost`, with the lost name's reason and a detail naming it; that name's hold span
// ends lost at the loss, the other name's is released once the job is dead, and the set span ends
// after both (at the end of the release of every name).
TEST_P(CliTracingLocks, TheLossOfOneNameMakesTheSetSpanLostNamingIt) {
  const auto ready = path("ready");
  std::vector<std::string> args{"run", "--url", url_, "--trace-file", path("spans.jsonl").string()};
  const std::vector<std::string> flags = redis() ? std::vector<std::string>{"--ttl", "3s", "--grace", "200ms"}
                                                 : std::vector<std::string>{"--ttl", "60s", "--grace", "10s"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {"--lock", "set/b", "--lock", "set/a", "--", "sh", "-c",
                           "echo x > " + ready.string() + ".tmp && mv " + ready.string() + ".tmp " +
                               ready.string() + "; while :; do sleep 0.05; done"});
  Cli run = Cli::start(args, dir_.path());
  ASSERT_TRUE(wait_for_file(ready, 20s)) << run.err();
  if (redis()) {
    Cli revoke = Cli::run({"revoke", "--url", url_, "--reason", "tracing test", "set/b"}, dir_.path());
    ASSERT_EQ(revoke.code(), 0) << revoke.err();
  } else {
    ASSERT_TRUE(fs_remove(path("locks") / "set%2Fb.lock") || fs_remove(path("locks") / "set/b.lock"))
        << "the lock file of set/b";
  }
  ASSERT_EQ(run.wait(20s), 76) << run.err();

  const auto spans = spans_of(path("spans.jsonl"));
  ASSERT_EQ(spans.count("distlock.lock_set"), 1u);
  const json& set = spans.find("distlock.lock_set")->second;
  const auto holds = by_lock(spans, "distlock.hold");
  ASSERT_EQ(holds.size(), 2u);
  const json& lost = holds.at("set/b");
  const json& kept = holds.at("set/a");
  EXPECT_EQ(attribute(lost, "distlock.outcome"), "lost");
  EXPECT_EQ(attribute(kept, "distlock.outcome"), "released");
  EXPECT_EQ(attribute(set, "distlock.outcome"), "lost");
  EXPECT_FALSE(attribute(set, "distlock.loss_reason").empty());
  EXPECT_EQ(attribute(set, "distlock.loss_reason"), attribute(lost, "distlock.loss_reason"));
  EXPECT_NE(attribute(set, "distlock.detail").find("lock \"set/b\" of the set"), std::string::npos)
      << attribute(set, "distlock.detail");
  EXPECT_EQ(set.at("status").value("code", 0), 2);  // ERROR, as a lost hold is
  // The set span ends after its children: the lost hold, then set/a's release.
  const std::uint64_t set_end = nanos(set, "endTimeUnixNano");
  EXPECT_LE(nanos(lost, "endTimeUnixNano"), nanos(kept, "endTimeUnixNano") + kWallSlackNs);
  EXPECT_GE(set_end + kWallSlackNs, nanos(kept, "endTimeUnixNano"));
  EXPECT_GE(set_end + kWallSlackNs, nanos(lost, "endTimeUnixNano"));
  std::printf("%s: set span ended %.3f ms after set/b's lost hold, %.3f ms after set/a's release\n",
              GetParam().c_str(), (static_cast<double>(set_end) - nanos(lost, "endTimeUnixNano")) / 1e6,
              (static_cast<double>(set_end) - nanos(kept, "endTimeUnixNano")) / 1e6);
}

INSTANTIATE_TEST_SUITE_P(Backends, CliTracingLocks, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

INSTANTIATE_TEST_SUITE_P(Backends, CliTracing, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace distlock::testing
