// `distlock run` and W3C trace context (docs/tracing.md), on file:// and on a redis-server
// the test starts: $TRACEPARENT is the parent of the runner's wait and hold spans, the job
// gets the hold span's context as its TRACEPARENT, --trace-file holds the spans as OTLP/JSON
// lines, and a malformed TRACEPARENT is ignored with a warning while the run goes on.
#include <gtest/gtest.h>

#include <chrono>
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

INSTANTIATE_TEST_SUITE_P(Backends, CliTracing, ::testing::Values("file", "redis"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace distlock::testing
