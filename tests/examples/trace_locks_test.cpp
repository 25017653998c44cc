// examples/tracing: trace_locks takes a lock with the OTLP/JSON lines exporter as its tracer
// (the exporter `distlock run --trace-file` uses), on file:// and on a redis-server the test
// starts. Checked: each line is one ExportTraceServiceRequest with one span; the wait and
// hold spans are children of $TRACEPARENT; on redis:// the renewal spans are children of the
// hold span; the hold printed by the program is the hold span of the file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace {

using distlock::testing::Process;
using distlock::testing::TempDir;
using nlohmann::json;

constexpr const char* kTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

std::vector<json> trace_lines(const std::string& file) {
  std::vector<json> spans;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const json req = json::parse(line);
    EXPECT_EQ(req.at("resourceSpans").size(), 1u);
    const json& scope = req.at("resourceSpans").at(0).at("scopeSpans").at(0);
    EXPECT_EQ(scope.at("scope").at("name"), "distlock");
    EXPECT_EQ(scope.at("spans").size(), 1u);
    const json& span = scope.at("spans").at(0);
    EXPECT_EQ(span.at("kind"), 1);
    EXPECT_EQ(span.at("traceId").get<std::string>().size(), 32u);
    EXPECT_EQ(span.at("spanId").get<std::string>().size(), 16u);
    EXPECT_LE(std::stoull(span.at("startTimeUnixNano").get<std::string>()),
              std::stoull(span.at("endTimeUnixNano").get<std::string>()));
    spans.push_back(span);
  }
  return spans;
}

void run_traced(const std::string& url, int hold_ms, bool expect_renewals) {
  TempDir dir("distlock-trace-locks");
  const std::string out = (dir.path() / "out").string(), file = (dir.path() / "spans.jsonl").string();
  Process p =
      Process::spawn({DISTLOCK_TRACE_LOCKS_PATH, url, "traced/example", file, std::to_string(hold_ms)}, out,
                     {std::string("TRACEPARENT=") + kTraceparent});
  const int status = p.wait_for(std::chrono::seconds(60));
  const std::string output = distlock::testing::read_file(out);
  ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  const auto spans = trace_lines(file);
  const json* wait = nullptr;
  const json* hold = nullptr;
  std::vector<const json*> renewals;
  for (const json& s : spans) {
    if (s.at("name") == "distlock.wait") wait = &s;
    if (s.at("name") == "distlock.hold") hold = &s;
    if (s.at("name") == "distlock.renewal") renewals.push_back(&s);
  }
  ASSERT_TRUE(wait && hold) << output;
  for (const json* s : {wait, hold}) {
    EXPECT_EQ(s->at("traceId"), "0af7651916cd43dd8448eb211c80319c");
    EXPECT_EQ(s->at("parentSpanId"), "b7ad6b7169203331");
  }
  EXPECT_NE(output.find("hold 00-0af7651916cd43dd8448eb211c80319c-" + hold->at("spanId").get<std::string>() +
                        "-01"),
            std::string::npos)
      << output;
  if (expect_renewals) {
    EXPECT_GE(renewals.size(), 1u) << output;
  }
  for (const json* r : renewals) {
    EXPECT_EQ(r->at("traceId"), "0af7651916cd43dd8448eb211c80319c");
    EXPECT_EQ(r->at("parentSpanId"), hold->at("spanId"));
  }
}

TEST(TraceLocksExample, WritesOtlpJsonLinesOnFile) {
  TempDir locks("distlock-trace-locks-dir");
  run_traced("file://" + (locks.path() / "locks").string(), 100, false);
}

TEST(TraceLocksExample, WritesRenewalSpansUnderTheHoldOnRedis) {
  distlock::testing::RedisServer redis;
  // ttl 3 s: renewed every second; 1.5 s held: at least one renewal round.
  run_traced(redis.url(), 1500, true);
}

}  // namespace
