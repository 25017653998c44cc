// SegmentGenerator (ids from a database segment) against real servers it starts itself:
// PostgreSQL (tests/support/postgres_server) and MariaDB (tests/support/mariadb_server),
// every test on both. Uniqueness across 4 processes x 4 threads x 100k ids, a generator
// SIGKILLed mid-range, a server crash and restart, fork(), a step change, a paused server
// (callers keep getting ids while the range lasts) and bad input.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "distlock/error.hpp"
#include "distlock/ids.hpp"
#include "support/ids_worker_output.hpp"
#include "support/mariadb_server.hpp"
#include "support/postgres_server.hpp"
#include "support/process.hpp"
#include "support/thrown.hpp"
#include "support/workload_size.hpp"

namespace distlock::testing {

namespace {

using namespace std::chrono_literals;
using ids::SegmentGenerator;
using ids::SegmentOptions;
using Steady = std::chrono::steady_clock;

// One database server of either kind, started by the test.
class Database {
 public:
  explicit Database(const std::string& kind) {
    if (kind == "postgres") {
      pg_.emplace();
    } else {
      my_.emplace();
    }
  }
  std::string url(const std::string& suffix = {}) const { return pg_ ? pg_->url(suffix) : my_->url(suffix); }
  std::string url_with_password(const std::string& pw) const {
    return pg_ ? pg_->url_with_password(pw) : my_->url_with_password(pw);
  }
  std::string password() const { return pg_ ? PostgresServer::kPassword : MariadbServer::kPassword; }
  std::string table() const { return pg_ ? "public.distlock_segments" : "distlock_test.distlock_segments"; }
  std::vector<std::vector<std::string>> query(const std::string& sql) const {
    return pg_ ? pg_->query(sql) : my_->query(sql);
  }
  // The row's max_id, or -1 when there is no row.
  std::int64_t max_id(const std::string& tag) const {
    auto rows = query("SELECT max_id FROM " + table() + " WHERE tag = '" + tag + "'");
    return rows.empty() ? -1 : std::stoll(rows[0][0]);
  }
  void kill() { pg_ ? pg_->kill() : my_->kill(); }
  void restart() { pg_ ? pg_->restart() : my_->restart(); }
  // Every server process stopped, existing sessions included (see the harnesses).
  void pause() { pg_ ? pg_->pause() : my_->pause(); }
  void resume() { pg_ ? pg_->resume() : my_->resume(); }

 private:
  std::optional<PostgresServer> pg_;
  std::optional<MariadbServer> my_;
};

class Segment : public ::testing::TestWithParam<std::string> {
 protected:
  Database db_{GetParam()};
};

std::vector<std::uint64_t> take(SegmentGenerator& g, std::size_t n) {
  std::vector<std::uint64_t> v(n);
  for (auto& id : v) id = g.next();
  return v;
}

bool strictly_increasing(const std::vector<std::uint64_t>& v) {
  return std::adjacent_find(v.begin(), v.end(), [](auto a, auto b) { return a >= b; }) == v.end();
}

TEST_P(Segment, HeaderExampleHandsOutPlainIdsOneRoundTripPerStep) {
  // The example of include/distlock/ids.hpp.
  distlock::ids::SegmentGenerator orders(db_.url(), {.tag = "orders", .step = 1000});
  std::uint64_t id = orders.next();  // from memory; one round trip per 1000 ids
  EXPECT_EQ(id, 1u);
  std::vector<std::uint64_t> rest = take(orders, 2499);
  EXPECT_EQ(rest.front(), 2u);
  EXPECT_EQ(rest.back(), 2500u);
  EXPECT_TRUE(strictly_increasing(rest));
  // (0, 1000] at construction, (1000, 2000] and (2000, 3000] each asked for with 10 % of
  // the range before it left.
  EXPECT_EQ(orders.round_trips(), 3u);
  EXPECT_EQ(db_.max_id("orders"), 3000);
  // A second generator of the tag starts above every range taken.
  SegmentGenerator other(db_.url(), {.tag = "orders", .step = 10});
  EXPECT_EQ(other.next(), 3001u);
  // Another tag is another id space; a new row takes the default step of 1000.
  SegmentGenerator invoices(db_.url(), {.tag = "invoices"});
  EXPECT_EQ(invoices.next(), 1u);
  EXPECT_EQ(db_.max_id("invoices"), 1000);
}

// ---- uniqueness across processes ------------------------------------------------------

constexpr int kProcesses = 4;
constexpr int kThreads = 4;
// 100,000 ids a thread; a quarter in a sanitized build (support/workload_size.hpp).
constexpr int kPerThread = workload_size(100'000);

TEST_P(Segment, UniqueAcrossFourProcessesOfFourThreads) {
  TempDir dir("distlock-segment-uniq");
  const std::string go = (dir.path() / "go").string();
  // Steps of different sizes at once on one row (1: the row's step, 1000).
  const std::vector<std::string> steps{"1000", "50", "5000", "1"};
  std::vector<Process> procs;
  std::vector<std::string> outs;
  for (int p = 0; p < kProcesses; ++p) {
    const std::string out = (dir.path() / ("p" + std::to_string(p))).string();
    outs.push_back(out);
    procs.push_back(Process::spawn(
        {DISTLOCK_IDS_WORKER_PATH, "--scheme", "segment", "--url", db_.url(), "--prefix", "uniq", "--reserve",
         steps[static_cast<std::size_t>(p)], "--threads", std::to_string(kThreads), "--count",
         std::to_string(kPerThread), "--out", out, "--go", go},
        out + ".log"));
  }
  for (const auto& out : outs) {
    ASSERT_TRUE(wait_for_file(out + ".ready", 30s, 2ms)) << first_line(out + ".log");
  }
  std::ofstream(go) << "go\n";
  std::vector<std::uint64_t> all;
  for (int p = 0; p < kProcesses; ++p) {
    const std::string& out = outs[static_cast<std::size_t>(p)];
    const int status = procs[static_cast<std::size_t>(p)].wait_for(240s);
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << p << " status " << status << ": " << first_line(out + ".log");
    for (int t = 0; t < kThreads; ++t) {
      const std::vector<std::uint64_t> v = read_ids(out + ".t" + std::to_string(t) + ".bin");
      ASSERT_EQ(v.size(), std::size_t{kPerThread}) << "process " << p << " thread " << t;
      // Threads share their process's generator: each one's ids increase.
      EXPECT_TRUE(strictly_increasing(v)) << "process " << p << " thread " << t;
      all.insert(all.end(), v.begin(), v.end());
    }
  }
  std::sort(all.begin(), all.end());
  const auto dup = std::adjacent_find(all.begin(), all.end());
  EXPECT_EQ(dup, all.end()) << "duplicate id " << (dup == all.end() ? 0 : *dup) << " among " << all.size();
  EXPECT_EQ(all.size(), std::size_t{kProcesses} * kThreads * kPerThread);
  EXPECT_GE(all.front(), 1u);
  // Every id lies in a range the row handed out.
  EXPECT_LE(all.back(), static_cast<std::uint64_t>(db_.max_id("uniq")));
}

// ---- faults ---------------------------------------------------------------------------

TEST_P(Segment, GeneratorKilledMidRangeLosesTheRestNeverReissuesIt) {
  TempDir dir("distlock-segment-crash");
  const std::string out = (dir.path() / "w").string();
  // One id per ms from a range of 100000: killed long before the range is used up.
  Process worker = Process::spawn(
      {DISTLOCK_IDS_WORKER_PATH, "--scheme", "segment", "--url", db_.url(), "--prefix", "crash", "--reserve",
       "100000", "--stream-ms", "60000", "--pause-us", "1000", "--out", out},
      out + ".log");
  ASSERT_TRUE(wait_for_file(out + ".issuing", 30s, 2ms)) << first_line(out + ".log");
  // At least 50 ids on disk (each written as it is issued).
  const auto until = Steady::now() + 20s;
  while (std::filesystem::file_size(out + ".t0.bin") < 50 * 8 && Steady::now() < until) {
    std::this_thread::sleep_for(2ms);
  }
  worker.signal(SIGKILL);
  const int status = worker.wait_for(10s);
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  const std::vector<std::uint64_t> issued = read_ids(out + ".t0.bin");
  ASSERT_GE(issued.size(), 50u);
  EXPECT_TRUE(strictly_increasing(issued));
  const std::int64_t max_id = db_.max_id("crash");
  EXPECT_EQ(max_id, 100000);  // one range taken, used to about 0.1 %
  EXPECT_LT(issued.back(), static_cast<std::uint64_t>(max_id));
  // The next generator starts right above the killed one's range: the rest of it is gone.
  SegmentGenerator after(db_.url(), {.tag = "crash", .step = 10});
  const std::vector<std::uint64_t> next = take(after, 100);
  EXPECT_EQ(next.front(), static_cast<std::uint64_t>(max_id) + 1);
  EXPECT_GT(next.front(), issued.back());
}

TEST_P(Segment, ServerCrashAndRestartNeverReusesAnId) {
  SegmentGenerator gen(db_.url("?timeout=2s"), {.tag = "restart", .step = 100});
  std::vector<std::uint64_t> ids = take(gen, 50);
  db_.kill();  // SIGKILL: only what was committed survives
  db_.restart();
  // The rest of the current range comes from memory; the next ranges from the restarted
  // server, on a new connection.
  for (std::uint64_t id : take(gen, 300)) ids.push_back(id);
  EXPECT_TRUE(strictly_increasing(ids));
  EXPECT_GE(gen.round_trips(), 4u);
  SegmentGenerator fresh(db_.url(), {.tag = "restart", .step = 100});
  EXPECT_GT(fresh.next(), ids.back());
  EXPECT_GE(db_.max_id("restart"), static_cast<std::int64_t>(ids.back()));
}

TEST_P(Segment, PausedServerStallsNoCallerWhileTheRangeLasts) {
  SegmentGenerator gen(db_.url("?timeout=1s"), {.tag = "slow", .step = 1000});
  EXPECT_EQ(gen.next(), 1u);
  db_.pause();
  // 999 ids from memory while the background take (asked for at id 900) hangs on the
  // stopped server. Bound (steady clock of this process): below the 1 s statement
  // timeout the take is waiting out, which a caller blocked on the take would have waited.
  const auto start = Steady::now();
  const std::vector<std::uint64_t> rest = take(gen, 999);
  const auto took = Steady::now() - start;
  EXPECT_EQ(rest.back(), 1000u);
  EXPECT_LT(took, 800ms) << "callers waited for the stopped database";
  // The range is used up: now the caller waits for the database and gets a clear error.
  std::error_code ec;
  const auto wait_start = Steady::now();
  const std::uint64_t got = gen.next(ec);
  EXPECT_EQ(ec, distlock::errc::backend_unavailable) << "got id " << got;
  EXPECT_LT(Steady::now() - wait_start, 20s);
  db_.resume();
  // The next call takes a new range (the one whose answer was lost is never used).
  std::uint64_t id = 0;
  for (int i = 0; i < 5 && (id = gen.next(ec), ec); ++i) {
  }
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_GT(id, 1000u);
}

TEST_P(Segment, ForkedChildRefusesAndLeavesTheParentsConnection) {
  auto gen = std::make_unique<SegmentGenerator>(db_.url(), SegmentOptions{.tag = "fork", .step = 100});
  const std::uint64_t before = gen->next();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::error_code ec;
    gen->next(ec);
    const bool refused = ec == distlock::errc::forked;
    gen.reset();  // must neither hang on the parent's thread nor close the parent's session
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  const auto end = Steady::now() + 10s;
  pid_t got = 0;
  while ((got = ::waitpid(child, &status, WNOHANG)) == 0 && Steady::now() < end)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(got, child) << "the child hung";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child was not refused: " << status;
  // The parent goes on, across new ranges.
  const std::vector<std::uint64_t> after = take(*gen, 300);
  EXPECT_GT(after.front(), before);
  EXPECT_TRUE(strictly_increasing(after));
}

// ---- step -----------------------------------------------------------------------------

TEST_P(Segment, StepChangeTakesEffectAtTheNextRange) {
  SegmentGenerator gen(db_.url(), {.tag = "step", .step = 100});
  EXPECT_EQ(gen.next(), 1u);
  EXPECT_EQ(gen.options().step, 100);
  gen.set_step(500);                   // the current range (0, 100] stays
  EXPECT_EQ(gen.options().step, 500);  // options() reports the step in force
  std::vector<std::uint64_t> ids = take(gen, 100);
  EXPECT_EQ(ids.back(), 101u);
  EXPECT_EQ(db_.max_id("step"), 600);  // the next range was (100, 600]
  EXPECT_THROW(gen.set_step(-1), std::system_error);
  EXPECT_EQ(gen.options().step, 500);  // a refused step changes nothing
  gen.set_step(0);
  EXPECT_EQ(gen.options().step, 0);

  // step 0: the row's step, which an administrator may change in the table.
  SegmentGenerator rowwise(db_.url(), {.tag = "rowstep"});
  EXPECT_EQ(db_.max_id("rowstep"), 1000);
  db_.query("UPDATE " + db_.table() + " SET step = 10 WHERE tag = 'rowstep'");
  ids = take(rowwise, 1001);
  EXPECT_EQ(ids.back(), 1001u);
  EXPECT_EQ(db_.max_id("rowstep"), 1010);
}

TEST_P(Segment, RowStepBelowOneIsRefusedAndNeverLowersMaxId) {
  SegmentGenerator gen(db_.url(), {.tag = "negstep", .step = 0});
  EXPECT_EQ(gen.next(), 1u);
  // An administrator's mistake: a take must not move max_id back (other generators would
  // then be handed ranges that were issued already).
  db_.query("UPDATE " + db_.table() + " SET step = -500 WHERE tag = 'negstep'");
  take(gen, 999);
  std::error_code ec;
  gen.next(ec);
  EXPECT_EQ(ec, distlock::errc::invalid_argument) << ec.message();
  EXPECT_EQ(db_.max_id("negstep"), 1000);
  db_.query("UPDATE " + db_.table() + " SET step = 0 WHERE tag = 'negstep'");
  gen.next(ec);
  EXPECT_EQ(ec, distlock::errc::invalid_argument) << ec.message();
  EXPECT_EQ(db_.max_id("negstep"), 1000);
  // Fixed: the next range starts above every id issued.
  db_.query("UPDATE " + db_.table() + " SET step = 10 WHERE tag = 'negstep'");
  std::uint64_t id = gen.next(ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(id, 1001u);
}

// The generator alone turns the database's answer into a range (ids/segment.cpp): a max_id
// that someone lowered below zero comes back below the step just added, and is refused
// (never a range reaching 0 or below), on both databases alike.
TEST_P(Segment, MaxIdLoweredBelowTheStepIsRefusedAsAProtocolError) {
  SegmentGenerator gen(db_.url(), {.tag = "lowered", .step = 10});
  EXPECT_EQ(gen.next(), 1u);
  db_.query("UPDATE " + db_.table() + " SET max_id = -100 WHERE tag = 'lowered'");
  take(gen, 9);  // the rest of (0, 10]; the next take answers max_id -90 with step 10
  try {
    const std::uint64_t id = gen.next();
    ADD_FAILURE() << "handed out id " << id << " from a range below max_id's floor";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), distlock::errc::protocol_error) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_id -90 is below the step 10"), std::string::npos) << e.what();
  }
}

// ---- errors ---------------------------------------------------------------------------

TEST_P(Segment, BadInputGetsAClearDistinctError) {
  using distlock::errc;
  const std::string url = db_.url();
  std::string what;
  EXPECT_EQ(code_of([&] { SegmentGenerator g(url, {.tag = ""}); }, &what), errc::invalid_argument);
  EXPECT_NE(what.find("tag"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { SegmentGenerator g(url, {.tag = std::string(129, 'a')}); }),
            errc::invalid_argument);
  EXPECT_EQ(code_of([&] { SegmentGenerator g(url, {.tag = "two words"}); }), errc::invalid_argument);
  EXPECT_EQ(code_of([&] { SegmentGenerator g(url, {.tag = "t", .step = -1}); }, &what),
            errc::invalid_argument);
  EXPECT_NE(what.find("step"), std::string::npos) << what;
  EXPECT_EQ(
      code_of([&] { SegmentGenerator g(url, {.tag = "t", .step = distlock::ids::kMaxSegmentStep + 1}); }),
      errc::invalid_argument);
  EXPECT_EQ(code_of([&] { SegmentGenerator g("redis://127.0.0.1:6379", {.tag = "t"}); }, &what),
            errc::invalid_url);
  EXPECT_NE(what.find("database URL"), std::string::npos) << what;
  EXPECT_EQ(code_of([&] { SegmentGenerator g(url + "?bogus=1", {.tag = "t"}); }), errc::invalid_url);
  // Wrong password: refused, and the password is not in the message.
  EXPECT_EQ(code_of([&] { SegmentGenerator g(db_.url_with_password("wrong-pw-xyz"), {.tag = "t"}); }, &what),
            errc::auth_failed);
  EXPECT_EQ(what.find("wrong-pw-xyz"), std::string::npos) << what;
  // Nothing listening.
  const std::string scheme = GetParam() == "postgres" ? "postgres" : "mysql";
  const std::string down =
      scheme + "://u:pw-down@127.0.0.1:" + std::to_string(free_port()) + "/db?timeout=500ms";
  EXPECT_EQ(code_of([&] { SegmentGenerator g(down, {.tag = "t"}); }, &what), errc::backend_unavailable);
  EXPECT_EQ(what.find("pw-down"), std::string::npos) << what;

  // max_id would pass 2^63 - 1: errc::exhausted, never a wrapped id.
  SegmentGenerator gen(url, {.tag = "full", .step = 1000});
  db_.query("UPDATE " + db_.table() + " SET max_id = 9223372036854775000 WHERE tag = 'full'");
  take(gen, 999);
  std::error_code ec;
  gen.next(ec);
  EXPECT_FALSE(ec);
  gen.next(ec);
  EXPECT_EQ(ec, errc::exhausted) << ec.message();
}

// A range that ends exactly at 2^63 - 1 (the database allows max_id to reach it: only a sum
// past it is an overflow). Its last id is handed out; the call after it must be
// errc::exhausted. Before the fix the generator's cursor overflowed past 2^63 - 1 and the
// next call returned 9223372036854775808 (an id no take ever handed out, outside the id
// space, and the start of a run that never asks the database again).
TEST_P(Segment, RangeEndingAtTheLargestIdIsHandedOutThenExhausted) {
  constexpr std::uint64_t kLargest = 9223372036854775807ull;
  SegmentGenerator gen(db_.url(), {.tag = "top", .step = 1000});
  db_.query("UPDATE " + db_.table() + " SET max_id = 9223372036854774807 WHERE tag = 'top'");
  std::vector<std::uint64_t> ids = take(gen, 2000);  // [1, 1000], then (2^63 - 1001, 2^63 - 1]
  EXPECT_EQ(ids[999], 1000u);
  EXPECT_EQ(ids[1000], kLargest - 999);
  EXPECT_EQ(ids.back(), kLargest);
  EXPECT_TRUE(strictly_increasing(ids));
  for (int i = 0; i < 3; ++i) {
    std::error_code ec;
    const std::uint64_t id = gen.next(ec);
    EXPECT_EQ(ec, distlock::errc::exhausted) << "call " << i << " returned id " << id << ": " << ec.message();
    EXPECT_EQ(id, 0u);
  }
  EXPECT_EQ(db_.max_id("top"), 9223372036854775807);
}

INSTANTIATE_TEST_SUITE_P(Databases, Segment, ::testing::Values("postgres", "mysql"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace

}  // namespace distlock::testing
