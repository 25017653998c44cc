// redis::read_acquire_reply (src/redis/lock_scripts.hpp), the one reader of the acquire
// script's reply for redis://, redis+sentinel:// and redis+cluster://: each shape the script
// gives, and malformed replies (wrong type, wrong arity, negative or out-of-range numbers)
// refused with errc::protocol_error and a detail naming what was wrong. The replies are
// parsed by hiredis's own reader from RESP text, as a server's would be. No server needed.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "distlock/error.hpp"
#include "redis/lock_scripts.hpp"

namespace {

namespace r = distlock::detail::redis;
using distlock::errc;
using distlock::detail::Error;
using Kind = r::AcquireReply::Kind;

/// The reply hiredis reads from `resp` (one complete RESP value).
r::Reply parse(const std::string& resp) {
  std::unique_ptr<redisReader, decltype(&redisReaderFree)> reader(redisReaderCreate(), &redisReaderFree);
  EXPECT_EQ(redisReaderFeed(reader.get(), resp.data(), resp.size()), REDIS_OK);
  void* out = nullptr;
  EXPECT_EQ(redisReaderGetReply(reader.get(), &out), REDIS_OK);
  EXPECT_NE(out, nullptr) << "incomplete RESP in the test: " << resp;
  return r::Reply(static_cast<redisReply*>(out));
}

r::AcquireReply read(const std::string& resp, Error& ec) {
  const r::Reply reply = parse(resp);
  return r::read_acquire_reply(reply.get(), ec);
}

TEST(RedisAcquireReply, OneAndATokenIsAcquiredWithThatToken) {
  Error ec;
  r::AcquireReply a = read("*2\r\n:1\r\n:42\r\n", ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(a.kind, Kind::acquired);
  EXPECT_EQ(a.token, 42u);
  // A token past 2^53 comes as a string of digits (the scripts format it with %.0f).
  a = read("*2\r\n:1\r\n$20\r\n18446744073709551615\r\n", ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(a.kind, Kind::acquired);
  EXPECT_EQ(a.token, 18446744073709551615u);
}

TEST(RedisAcquireReply, ZeroAndAPttlIsBusyWithTheHoldersRemainingTime) {
  Error ec;
  r::AcquireReply a = read("*2\r\n:0\r\n:2500\r\n", ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(a.kind, Kind::busy);
  EXPECT_EQ(a.holder_ttl, std::chrono::milliseconds(2500));
  // PTTL's -1 (no expiry), -2 (just gone) and 0: busy, the holder's time unknown.
  for (const char* pttl : {"-1", "-2", "0"}) {
    a = read(std::string("*2\r\n:0\r\n:") + pttl + "\r\n", ec);
    ASSERT_FALSE(ec) << pttl << ": " << ec.detail();
    EXPECT_EQ(a.kind, Kind::busy) << pttl;
    EXPECT_EQ(a.holder_ttl, std::chrono::milliseconds(0)) << pttl;
  }
}

TEST(RedisAcquireReply, TwoAloneIsGone) {
  Error ec;
  const r::AcquireReply a = read("*1\r\n:2\r\n", ec);
  ASSERT_FALSE(ec) << ec.detail();
  EXPECT_EQ(a.kind, Kind::gone);
}

TEST(RedisAcquireReply, AnErrorReplyKeepsItsCodeAndTheServersText) {
  Error ec;
  read("-BUSY Redis is busy running a script\r\n", ec);
  EXPECT_EQ(ec, distlock::make_error_code(errc::backend_unavailable));
  EXPECT_NE(ec.detail().find("BUSY Redis is busy running a script"), std::string::npos) << ec.detail();
  read("-NOPERM this user has no permissions to run the 'evalsha' command\r\n", ec);
  EXPECT_EQ(ec, distlock::make_error_code(errc::auth_failed));
  read("-ERR something else\r\n", ec);
  EXPECT_EQ(ec, distlock::make_error_code(errc::protocol_error));
  EXPECT_NE(ec.detail().find("ERR something else"), std::string::npos) << ec.detail();
}

TEST(RedisAcquireReply, MalformedRepliesAreProtocolErrorsNamingWhatWasWrong) {
  struct Case {
    const char* resp;
    const char* why;  // a part of the detail
  };
  const Case cases[] = {
      {":1\r\n", "not an array"},                              // wrong type
      {"$2\r\nok\r\n", "not an array"},                        // wrong type
      {"*0\r\n", "first element"},                             // empty
      {"*2\r\n:3\r\n:1\r\n", "first element"},                 // unknown flag
      {"*2\r\n:-1\r\n:1\r\n", "first element"},                // negative flag
      {"*2\r\n$1\r\nx\r\n:1\r\n", "first element"},            // flag not a number
      {"*1\r\n:1\r\n", "1 elements for flag 1, not 2"},        // acquired without a token
      {"*3\r\n:1\r\n:7\r\n:8\r\n", "3 elements for flag 1"},   // acquired, one too many
      {"*1\r\n:0\r\n", "1 elements for flag 0, not 2"},        // busy without a pttl
      {"*2\r\n:2\r\n:5\r\n", "2 elements for flag 2, not 1"},  // gone with more
      {"*2\r\n:1\r\n:-5\r\n", "token"},                        // negative token
      {"*2\r\n:1\r\n$3\r\n12a\r\n", "token"},                  // token not digits
      {"*2\r\n:1\r\n*0\r\n", "token"},                         // token of the wrong type
      {"*2\r\n:1\r\n$-1\r\n", "token"},                        // nil token
      {"*2\r\n:0\r\n:-3\r\n", "pttl"},                         // pttl below -2
      {"*2\r\n:0\r\n$4\r\n2500\r\n", "pttl"},                  // pttl of the wrong type
  };
  for (const Case& c : cases) {
    Error ec;
    const r::AcquireReply a = read(c.resp, ec);
    EXPECT_EQ(ec, distlock::make_error_code(errc::protocol_error)) << c.resp;
    EXPECT_NE(ec.detail().find("unexpected reply to the acquire script"), std::string::npos) << ec.detail();
    EXPECT_NE(ec.detail().find(c.why), std::string::npos) << c.resp << ": " << ec.detail();
    EXPECT_EQ(a.kind, Kind::busy) << c.resp;
    EXPECT_EQ(a.token, 0u) << c.resp;
  }
  Error ec;
  r::read_acquire_reply(nullptr, ec);
  EXPECT_EQ(ec, distlock::make_error_code(errc::protocol_error));
}

// redis::answer_of, what both queue backends make of a reply: acquired with its token and the
// request's ttl as validity, busy with the holder's time, gone with nothing acquired.
TEST(RedisAcquireReply, AnswerOfEachKindIsWhatTheQueueBackendsReturn) {
  using namespace std::chrono_literals;
  const r::QueueAnswer acquired = r::answer_of({Kind::acquired, 42, 0ms}, 30000ms);
  EXPECT_TRUE(acquired.result.acquired);
  EXPECT_EQ(acquired.result.token, 42u);
  EXPECT_EQ(acquired.result.validity, 30000ms);
  EXPECT_FALSE(acquired.gone);
  const r::QueueAnswer busy = r::answer_of({Kind::busy, 0, 2500ms}, 30000ms);
  EXPECT_FALSE(busy.result.acquired);
  EXPECT_EQ(busy.result.holder_ttl, std::optional(2500ms));
  EXPECT_FALSE(busy.gone);
  const r::QueueAnswer gone = r::answer_of({Kind::gone, 0, 0ms}, 30000ms);
  EXPECT_FALSE(gone.result.acquired);
  EXPECT_TRUE(gone.gone);
}

}  // namespace
