// Fenced writes: a stale token is rejected and writes nothing; equal and larger
// tokens are applied and recorded; the check and the write are atomic under
// concurrency. Redis tests run against a real redis-server started per test suite.
#include "distlock/fencing.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "distlock/error.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/thrown.hpp"

namespace {

using distlock::FenceStatus;
using distlock::RedisFence;
using distlock::testing::code_of;
using distlock::testing::RedisServer;

class RedisFenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RedisServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    server_->command({"FLUSHALL"});
  }
  std::string get(const std::string& key) {
    auto r = server_->command({"GET", key});
    return r && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : std::string("<nil>");
  }
  static RedisServer* server_;
};
RedisServer* RedisFenceTest::server_ = nullptr;

TEST_F(RedisFenceTest, StaleTokenIsRejectedAndWritesNothing) {
  RedisFence fence(server_->url());
  auto a = fence.set("doc", "v7", 7);
  EXPECT_EQ(a.status, FenceStatus::applied);
  EXPECT_EQ(a.highest_token, 7u);
  EXPECT_EQ(get("doc"), "v7");
  EXPECT_EQ(get("doc:distlock-fence"), "7");

  auto stale = fence.set("doc", "v5", 5);
  EXPECT_EQ(stale.status, FenceStatus::stale);
  EXPECT_EQ(stale.highest_token, 7u);
  EXPECT_FALSE(stale);
  EXPECT_EQ(get("doc"), "v7");
  EXPECT_EQ(get("doc:distlock-fence"), "7");
  EXPECT_EQ(fence.highest_token("doc"), 7u);

  std::string what;
  EXPECT_EQ(code_of([&] { stale.check(5); }, &what), distlock::errc::lost) << "check() of a stale result";
  EXPECT_NE(what.find("token 5"), std::string::npos) << what;
}

TEST_F(RedisFenceTest, EqualAndLargerTokensAreApplied) {
  RedisFence fence(server_->url());
  EXPECT_TRUE(fence.set("doc", "a", 3).applied());
  EXPECT_TRUE(fence.set("doc", "b", 3).applied());  // the same holder writes again
  EXPECT_EQ(get("doc"), "b");
  EXPECT_TRUE(fence.set("doc", "c", 4).applied());
  EXPECT_EQ(get("doc"), "c");
  EXPECT_EQ(fence.highest_token("doc"), 4u);
  EXPECT_EQ(fence.get("doc").value_or(""), "c");
  EXPECT_FALSE(fence.get("missing").has_value());
  // The fence never expires.
  EXPECT_EQ(server_->command({"PTTL", "doc:distlock-fence"})->integer, -1);
}

TEST_F(RedisFenceTest, TokensAreComparedExactlyBeyondDoublePrecision) {
  RedisFence fence(server_->url());
  const std::uint64_t big = (1ULL << 53) + 1;  // a double cannot tell big from big - 1
  ASSERT_TRUE(fence.set("doc", "big", big).applied());
  EXPECT_EQ(fence.set("doc", "smaller", big - 1).status, FenceStatus::stale);
  EXPECT_EQ(get("doc"), "big");
  const std::uint64_t max = UINT64_MAX;
  EXPECT_TRUE(fence.set("doc", "max", max).applied());
  EXPECT_EQ(fence.highest_token("doc"), max);
  EXPECT_EQ(fence.set("doc", "less", max - 1).status, FenceStatus::stale);
  EXPECT_EQ(get("doc"), "max");
  // A shorter decimal is smaller even if it sorts later as text ("9" vs "10").
  ASSERT_TRUE(fence.set("n", "ten", 10).applied());
  EXPECT_EQ(fence.set("n", "nine", 9).status, FenceStatus::stale);
}

TEST_F(RedisFenceTest, HashFieldWrite) {
  RedisFence fence(server_->url());
  EXPECT_TRUE(fence.hset("order:1", "state", "paid", 10).applied());
  EXPECT_EQ(fence.hset("order:1", "state", "cancelled", 9).status, FenceStatus::stale);
  auto r = server_->command({"HGET", "order:1", "state"});
  ASSERT_EQ(r->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(r->str, r->len), "paid");
  EXPECT_EQ(fence.highest_token("order:1"), 10u);
}

TEST_F(RedisFenceTest, DecrementIfPositive) {
  RedisFence fence(server_->url());
  server_->command({"SET", "stock", "2"});
  auto d1 = fence.decrement_if_positive("stock", 1);
  EXPECT_TRUE(d1.applied());
  EXPECT_TRUE(d1.decremented);
  EXPECT_EQ(d1.value, 1);
  auto d2 = fence.decrement_if_positive("stock", 2);
  EXPECT_TRUE(d2.decremented);
  EXPECT_EQ(d2.value, 0);
  auto d3 = fence.decrement_if_positive("stock", 3);
  EXPECT_TRUE(d3.applied());
  EXPECT_FALSE(d3.decremented);  // sold out: applied, nothing to take
  EXPECT_EQ(d3.value, 0);
  EXPECT_EQ(get("stock"), "0");

  server_->command({"SET", "stock", "5"});
  auto stale = fence.decrement_if_positive("stock", 2);
  EXPECT_EQ(stale.status, FenceStatus::stale);
  EXPECT_FALSE(stale.decremented);
  EXPECT_EQ(stale.highest_token, 3u);
  EXPECT_EQ(get("stock"), "5");

  auto missing = fence.decrement_if_positive("nothing", 1);
  EXPECT_TRUE(missing.applied());
  EXPECT_FALSE(missing.decremented);
  EXPECT_EQ(get("nothing"), "<nil>");
}

TEST_F(RedisFenceTest, DecrementOfANonIntegerIsAProtocolErrorAndRecordsNothing) {
  RedisFence fence(server_->url());
  server_->command({"SET", "stock", "lots"});
  std::error_code ec;
  auto r = fence.decrement_if_positive("stock", 4, ec);
  EXPECT_EQ(ec, distlock::errc::protocol_error);
  EXPECT_FALSE(r.applied());
  EXPECT_EQ(get("stock"), "lots");
  EXPECT_EQ(get("stock:distlock-fence"), "<nil>");
  std::string what;
  EXPECT_EQ(code_of([&] { fence.decrement_if_positive("stock", 4); }, &what), distlock::errc::protocol_error);
  EXPECT_NE(what.find("not an integer"), std::string::npos) << what;
}

// Values Lua's tonumber accepts but DECR refuses (leading zeros, beyond int64, a
// sign on zero...) must fail before the fence moves; for every value Redis's own
// DECR is the judge, run on a scratch copy.
TEST_F(RedisFenceTest, DecrementValidatesLikeRedisBeforeMovingTheFence) {
  RedisFence fence(server_->url());
  const std::vector<std::string> values{"007",
                                        "9223372036854775808",
                                        "9223372036854775807",
                                        "-0",
                                        "+5",
                                        " 5",
                                        "5 ",
                                        "1e3",
                                        "0x10",
                                        "",
                                        "-007",
                                        "-9223372036854775809",
                                        "-9223372036854775808",
                                        "0",
                                        "-5",
                                        "5",
                                        "9007199254740994",
                                        "1.0"};
  std::uint64_t token = 1;
  for (const auto& v : values) {
    SCOPED_TRACE("value \"" + v + "\"");
    server_->command({"DEL", "stock", "stock:distlock-fence", "scratch"});
    server_->command({"SET", "stock", v});
    server_->command({"SET", "scratch", v});
    auto redis_decr = server_->command({"DECR", "scratch"});
    // DECR parses first; INT64_MIN parses but cannot go lower ("would overflow").
    const bool redis_accepts_integer =
        redis_decr->type == REDIS_REPLY_INTEGER ||
        std::string(redis_decr->str ? redis_decr->str : "").find("overflow") != std::string::npos;
    std::error_code ec;
    const auto r = fence.decrement_if_positive("stock", ++token, ec);
    if (!redis_accepts_integer) {
      EXPECT_EQ(ec, distlock::errc::protocol_error);
      EXPECT_EQ(get("stock"), v);
      EXPECT_EQ(get("stock:distlock-fence"), "<nil>") << "the fence moved for a value DECR refuses";
      continue;
    }
    ASSERT_FALSE(ec) << ec.message();
    ASSERT_TRUE(r.applied());
    EXPECT_EQ(get("stock:distlock-fence"), std::to_string(token));
    const long long n = std::stoll(v);
    if (n > 0) {
      EXPECT_TRUE(r.decremented);
      EXPECT_EQ(r.value, redis_decr->integer);  // exact, even beyond 2^53
      EXPECT_EQ(get("stock"), std::to_string(redis_decr->integer));
    } else {
      EXPECT_FALSE(r.decremented);
      EXPECT_EQ(r.value, n);
      EXPECT_EQ(get("stock"), v);
    }
  }
}

TEST_F(RedisFenceTest, HsetOnANonHashFailsBeforeTheFenceMoves) {
  RedisFence fence(server_->url());
  server_->command({"SET", "doc", "a string"});
  std::error_code ec;
  fence.hset("doc", "f", "v", 3, ec);
  EXPECT_EQ(ec, distlock::errc::protocol_error);
  EXPECT_EQ(get("doc"), "a string");
  EXPECT_EQ(get("doc:distlock-fence"), "<nil>");
}

// Redis does not roll back a script: what a fenced eval body wrote before an error
// stays, and so does the fence (a newer token did write). The error says so.
TEST_F(RedisFenceTest, ABodyFailingHalfWayKeepsItsWritesAndTheFenceAndSaysSo) {
  RedisFence fence(server_->url());
  server_->command({"SET", "counter", "not a number"});
  std::error_code ec;
  fence.eval("redis.call('SET', KEYS[1], 'partial') return redis.call('INCR', KEYS[2])", {"doc", "counter"},
             {}, 5, ec);
  EXPECT_EQ(ec, distlock::errc::protocol_error);
  EXPECT_EQ(get("doc"), "partial");
  EXPECT_EQ(get("doc:distlock-fence"), "5");
  try {
    fence.eval("redis.call('SET', KEYS[1], 'partial') return redis.call('INCR', KEYS[2])", {"doc", "counter"},
               {}, 6);
    ADD_FAILURE() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("not rolled back"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ERR value is not an integer"), std::string::npos) << e.what();
  }
  // A body that checks first and fails before writing leaves everything as it was.
  fence.eval(
      "if redis.call('GET', KEYS[2]) ~= '1' then return redis.error_reply('counter is not 1') end "
      "redis.call('SET', KEYS[1], 'written')",
      {"doc", "counter"}, {}, 7, ec);
  EXPECT_EQ(ec, distlock::errc::protocol_error);
  EXPECT_EQ(get("doc"), "partial");
}

TEST_F(RedisFenceTest, GuardedScriptBody) {
  RedisFence fence(server_->url());
  const std::string body =
      "redis.call('RPUSH', KEYS[1], ARGV[1]) redis.call('SET', KEYS[2], ARGV[2]) "
      "return {redis.call('LLEN', KEYS[1]), #KEYS, #ARGV}";
  auto r = fence.eval(body, {"buyers", "last"}, {"alice", "42"}, 8);
  ASSERT_TRUE(r.applied());
  ASSERT_EQ(r.reply.type, distlock::RedisValue::Type::array);
  ASSERT_EQ(r.reply.elements.size(), 3u);
  EXPECT_EQ(r.reply.elements[0].integer, 1);
  EXPECT_EQ(r.reply.elements[1].integer, 2);  // the body sees only its own keys...
  EXPECT_EQ(r.reply.elements[2].integer, 2);  // ...and its own arguments
  EXPECT_EQ(get("last"), "42");
  EXPECT_EQ(get("buyers:distlock-fence"), "8");  // the fence follows keys[0]

  auto stale = fence.eval(body, {"buyers", "last"}, {"mallory", "0"}, 7);
  EXPECT_EQ(stale.status, FenceStatus::stale);
  EXPECT_EQ(stale.reply.type, distlock::RedisValue::Type::nil);
  EXPECT_EQ(server_->command({"LLEN", "buyers"})->integer, 1);
  EXPECT_EQ(get("last"), "42");

  // A body that returns nothing, and one that returns a string.
  auto nil = fence.eval("redis.call('DEL', KEYS[1])", {"last"}, {}, 9);
  EXPECT_TRUE(nil.applied());
  EXPECT_EQ(nil.reply.type, distlock::RedisValue::Type::nil);
  auto str = fence.eval("return ARGV[1] .. '!'", {"k"}, {"hi"}, 1);
  EXPECT_EQ(str.reply.type, distlock::RedisValue::Type::string);
  EXPECT_EQ(str.reply.str, "hi!");
}

TEST_F(RedisFenceTest, ScriptErrorsAndBadArguments) {
  RedisFence fence(server_->url());
  std::error_code ec;
  fence.eval("return redis.call('NOSUCHCOMMAND')", {"k"}, {}, 1, ec);
  EXPECT_EQ(ec, distlock::errc::protocol_error);
  fence.eval("return 1", {}, {}, 1, ec);
  EXPECT_EQ(ec, distlock::errc::invalid_argument);
  fence.eval("", {"k"}, {}, 1, ec);
  EXPECT_EQ(ec, distlock::errc::invalid_argument);
  fence.eval("this is not lua", {"k"}, {}, 1, ec);
  EXPECT_EQ(ec, distlock::errc::protocol_error);
}

TEST_F(RedisFenceTest, SurvivesScriptFlush) {
  RedisFence fence(server_->url());
  ASSERT_TRUE(fence.set("doc", "a", 1).applied());
  ASSERT_TRUE(fence.eval("return 1", {"doc"}, {}, 1).applied());
  server_->command({"SCRIPT", "FLUSH"});  // NOSCRIPT next time: reloaded and retried
  EXPECT_TRUE(fence.set("doc", "b", 2).applied());
  EXPECT_TRUE(fence.eval("return 1", {"doc"}, {}, 2).applied());
  EXPECT_EQ(get("doc"), "b");
}

TEST_F(RedisFenceTest, BinarySafeKeysAndValues) {
  RedisFence fence(server_->url());
  const std::string key("k\0ey\r\n x", 9), value("v\0al\r\nue", 8);
  ASSERT_TRUE(fence.set(key, value, 1).applied());
  auto r = server_->command({"GET", key});
  ASSERT_EQ(r->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(r->str, r->len), value);
  EXPECT_EQ(fence.set(key, "x", 0).status, FenceStatus::stale);
}

// Writers with increasing tokens race; every applied write appends its token to a
// list in the same script. The list must never go down: a stale write can never land
// after a newer one, and every rejected write saw a larger token.
TEST_F(RedisFenceTest, ConcurrentWritersNeverApplyAStaleTokenAfterANewerOne) {
  RedisFence fence(server_->url());
  constexpr int kThreads = 8, kWrites = 150;
  std::atomic<std::uint64_t> next{1};
  std::atomic<int> applied{0}, stale{0}, bad_stale{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kWrites; ++i) {
        const std::uint64_t token = next.fetch_add(1);
        auto r = fence.eval("redis.call('RPUSH', KEYS[1], ARGV[1]) return 1", {"log"},
                            {std::to_string(token)}, token);
        if (r.applied()) {
          ++applied;
        } else {
          ++stale;
          if (r.highest_token <= token) ++bad_stale;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(applied + stale, kThreads * kWrites);
  EXPECT_EQ(bad_stale, 0);
  auto list = server_->command({"LRANGE", "log", "0", "-1"});
  ASSERT_EQ(list->type, REDIS_REPLY_ARRAY);
  ASSERT_EQ(static_cast<int>(list->elements), applied.load());
  std::uint64_t prev = 0;
  for (std::size_t i = 0; i < list->elements; ++i) {
    const std::uint64_t v = std::stoull(std::string(list->element[i]->str, list->element[i]->len));
    EXPECT_GE(v, prev) << "token " << v << " applied after " << prev;
    prev = v;
  }
  EXPECT_EQ(fence.highest_token("log"), prev);
}

TEST(RedisFenceErrors, BadUrls) {
  for (const char* url : {"file:///tmp/x", "redis://", "redis://127.0.0.1:99999", "nonsense"}) {
    try {
      RedisFence f(url);
      ADD_FAILURE() << "no error for " << url;
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), distlock::errc::invalid_url) << url << ": " << e.what();
    }
  }
}

TEST(RedisFenceErrors, ServerDownIsUnavailableNamingTheServer) {
  const auto port = distlock::testing::free_port();
  RedisFence fence("redis://127.0.0.1:" + std::to_string(port) + "?timeout=500ms");
  std::string what;
  EXPECT_EQ(code_of([&] { fence.set("k", "v", 1); }, &what), distlock::errc::backend_unavailable);
  EXPECT_NE(what.find(std::to_string(port)), std::string::npos) << what;
}

TEST(RedisFenceErrors, WrongPasswordIsAuthFailed) {
  RedisServer server({.password = "right"});
  RedisFence good(server.url());
  EXPECT_TRUE(good.set("k", "v", 1).applied());
  const std::string bad = "redis://:wrong@127.0.0.1:" + std::to_string(server.port());
  RedisFence fence(bad);
  std::error_code ec;
  fence.set("k", "w", 2, ec);
  EXPECT_EQ(ec, distlock::errc::auth_failed);
  auto r = server.command({"GET", "k"});
  EXPECT_EQ(std::string(r->str, r->len), "v");
}

// ---- FileFence ----------------------------------------------------------------

TEST(FileFence, StaleTokenIsRejectedAndTheWriteDoesNotRun) {
  distlock::testing::TempDir dir;
  distlock::FileFence fence(dir.path() / "res.fence");
  EXPECT_EQ(fence.highest_token(), 0u);
  int writes = 0;
  EXPECT_TRUE(fence.apply(5, [&] { ++writes; }).applied());
  EXPECT_TRUE(fence.apply(5, [&] { ++writes; }).applied());
  EXPECT_TRUE(fence.apply(6, [&] { ++writes; }).applied());
  auto stale = fence.apply(4, [&] { ++writes; });
  EXPECT_EQ(stale.status, FenceStatus::stale);
  EXPECT_EQ(stale.highest_token, 6u);
  EXPECT_EQ(writes, 3);
  EXPECT_EQ(fence.highest_token(), 6u);
  // A second FileFence on the same file sees the same fence (as another process would).
  distlock::FileFence other(dir.path() / "res.fence");
  EXPECT_EQ(other.apply(1, [&] { ++writes; }).status, FenceStatus::stale);
  EXPECT_EQ(writes, 3);
  fence.reset();
  EXPECT_EQ(fence.highest_token(), 0u);
}

TEST(FileFence, ErrorsNameTheFile) {
  distlock::testing::TempDir dir;
  distlock::FileFence missing_dir(dir.path() / "no" / "such" / "dir.fence");
  std::error_code ec;
  missing_dir.apply(
      1, [] {}, ec);
  EXPECT_EQ(ec, distlock::errc::backend_unavailable);
  try {
    missing_dir.apply(1, [] {});
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("dir.fence"), std::string::npos) << e.what();
  }
  std::ofstream(dir.path() / "garbage.fence") << "not a number";
  distlock::FileFence garbage(dir.path() / "garbage.fence");
  garbage.apply(
      1, [] {}, ec);
  EXPECT_EQ(ec, distlock::errc::protocol_error);
  EXPECT_THROW(distlock::FileFence(""), std::system_error);
}

TEST(FileFence, AWriteThatThrowsReleasesTheLock) {
  distlock::testing::TempDir dir;
  distlock::FileFence fence(dir.path() / "f");
  EXPECT_THROW(fence.apply(1, [] { throw std::runtime_error("disk full"); }), std::runtime_error);
  int ran = 0;
  EXPECT_TRUE(fence.apply(1, [&] { ++ran; }).applied());  // would hang if the lock were kept
  EXPECT_EQ(ran, 1);
}

// Several processes x threads with interleaved tokens; each applied write appends
// its token to a data file inside the fence. The data file must never go down.
TEST(FileFence, ConcurrentProcessesNeverApplyAStaleTokenAfterANewerOne) {
  distlock::testing::TempDir dir;
  const auto fence_path = dir.path() / "res.fence";
  const auto data_path = dir.path() / "res.data";
  constexpr int kProcs = 3, kThreads = 4, kWrites = 100;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int failures = 0;
      std::vector<std::thread> threads;
      std::atomic<int> bad{0};
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          distlock::FileFence fence(fence_path);
          for (int i = 0; i < kWrites; ++i) {
            // Tokens interleave between writers: many arrive late (stale).
            const std::uint64_t token = static_cast<std::uint64_t>(i) * kProcs * kThreads + p * kThreads + t;
            try {
              auto r = fence.apply(token, [&] { std::ofstream(data_path, std::ios::app) << token << "\n"; });
              if (!r.applied() && r.highest_token <= token) ++bad;
            } catch (...) {
              ++bad;
            }
          }
        });
      }
      for (auto& th : threads) th.join();
      failures = bad.load();
      ::_exit(failures == 0 ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer process failed";
  }
  std::ifstream in(data_path);
  std::uint64_t prev = 0, v = 0;
  int lines = 0;
  while (in >> v) {
    EXPECT_GE(v, prev);
    prev = v;
    ++lines;
  }
  EXPECT_GT(lines, 0);
  EXPECT_EQ(distlock::FileFence(fence_path).highest_token(), prev);
}

// ---- FenceGuard -----------------------------------------------------------------

// FileFence never follows a symbolic link (somebody could point the fence at another
// file, which it would create or overwrite), and uses only a regular file that the
// caller or root owns (another user's file could be unlocked or forged by that user).
TEST(FileFence, SymlinksAndUntrustedFilesAreRefused) {
  distlock::testing::TempDir dir;
  auto expect_refused = [](const std::function<void()>& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one naming " << part;
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), distlock::errc::backend_unavailable) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  // A link to an existing file: the file is neither read as a fence nor written.
  const auto victim = dir.path() / "victim";
  std::ofstream(victim) << "7\n";
  std::filesystem::create_symlink(victim, dir.path() / "link.fence");
  distlock::FileFence link(dir.path() / "link.fence");
  bool wrote = false;
  expect_refused([&] { link.apply(9, [&] { wrote = true; }); }, "link.fence");
  EXPECT_FALSE(wrote);
  expect_refused([&] { (void)link.highest_token(); }, "link.fence");
  std::ifstream in(victim);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "7\n");
  // A dangling link: its target is not created.
  std::filesystem::create_symlink(dir.path() / "created-through-link", dir.path() / "dangling.fence");
  expect_refused([&] { distlock::FileFence(dir.path() / "dangling.fence").apply(1, [] {}); },
                 "dangling.fence");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "created-through-link"));
  // Not a regular file (a FIFO).
  ASSERT_EQ(::mkfifo((dir.path() / "fifo.fence").c_str(), 0600), 0);
  expect_refused([&] { distlock::FileFence(dir.path() / "fifo.fence").apply(1, [] {}); },
                 "not a regular file");
  expect_refused([&] { (void)distlock::FileFence(dir.path() / "fifo.fence").highest_token(); },
                 "not a regular file");
  // Owned by another user (nobody): refused; back to root: used.
  if (::geteuid() == 0) {
    const auto theirs = dir.path() / "theirs.fence";
    distlock::FileFence fence(theirs);
    fence.apply(3, [] {});
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    expect_refused([&] { fence.apply(4, [] {}); }, "owned by uid 65534");
    expect_refused([&] { (void)fence.highest_token(); }, "owned by uid 65534");
    ASSERT_EQ(::chown(theirs.c_str(), 0, 0), 0);
    EXPECT_EQ(fence.apply(4, [] {}).status, FenceStatus::applied);
  }
  // A new fence file is created readable and writable by its owner only (a reader could
  // hold a read lock and block every writer).
  distlock::FileFence fresh(dir.path() / "fresh.fence");
  fresh.apply(1, [] {});
  EXPECT_EQ(std::filesystem::status(dir.path() / "fresh.fence").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST(FenceGuard, AdmitIsAnAtomicMaximum) {
  distlock::FenceGuard g;
  EXPECT_TRUE(g.admit(3));
  EXPECT_TRUE(g.admit(3));
  EXPECT_FALSE(g.admit(2));
  EXPECT_TRUE(g.admit(10));
  EXPECT_EQ(g.highest(), 10u);
}

TEST(FenceGuard, ApplyNeverRunsAStaleWriteAfterANewerOne) {
  distlock::FenceGuard g;
  std::vector<std::uint64_t> written;  // touched only inside apply()
  std::atomic<std::uint64_t> next{1};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        const std::uint64_t token = next.fetch_add(1);
        g.apply(token, [&] { written.push_back(token); });
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_FALSE(written.empty());
  EXPECT_TRUE(std::is_sorted(written.begin(), written.end()));
  EXPECT_EQ(g.highest(), written.back());
  auto stale = g.apply(1, [&] { written.push_back(0); });
  EXPECT_EQ(stale.status, FenceStatus::stale);
  EXPECT_NE(written.back(), 0u);
}

}  // namespace
