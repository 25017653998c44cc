// The C API's segment ids (distlock_segment_*) against a real PostgreSQL this test starts
// (tests/support/postgres_server): plain increasing ids shared by two generators of a tag,
// and each failure as its distinct code with a message that names it (never the password).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "distlock/distlock.h"
#include "support/postgres_server.hpp"

namespace {

using distlock::testing::PostgresServer;

TEST(CApiSegment, IdsFromADatabaseRowAndDistinctErrors) {
  PostgresServer pg;
  const std::string url = pg.url();
  distlock_error err{};
  distlock_segment* a = nullptr;
  ASSERT_EQ(distlock_segment_new(url.c_str(), "capi", 10, &a, &err), DISTLOCK_OK) << err.message;
  std::uint64_t x = 0, y = 0;
  ASSERT_EQ(distlock_segment_next(a, &x, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_segment_next(a, &y, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(x, 1u);
  EXPECT_EQ(y, 2u);
  // A second generator of the tag starts above the first one's range (0, 10].
  distlock_segment* b = nullptr;
  ASSERT_EQ(distlock_segment_new(url.c_str(), "capi", 0, &b, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_segment_next(b, &x, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(x, 11u);
  distlock_segment_free(b);
  distlock_segment_free(a);
  distlock_segment_free(nullptr);

  distlock_segment* bad = nullptr;
  EXPECT_EQ(distlock_segment_new(url.c_str(), "", 0, &bad, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(err.message, "tag"), nullptr) << err.message;
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(distlock_segment_new(url.c_str(), "t", -5, &bad, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(err.message, "step"), nullptr) << err.message;
  EXPECT_EQ(distlock_segment_new("redis://127.0.0.1:1", "t", 0, &bad, &err), DISTLOCK_E_INVALID_URL);
  EXPECT_EQ(distlock_segment_new(nullptr, "t", 0, &bad, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_EQ(distlock_segment_next(nullptr, &x, &err), DISTLOCK_E_INVALID_ARGUMENT);
  const std::string wrong = pg.url_with_password("c-api-wrong-pw");
  EXPECT_EQ(distlock_segment_new(wrong.c_str(), "t", 0, &bad, &err), DISTLOCK_E_AUTH_FAILED) << err.message;
  EXPECT_EQ(std::strstr(err.message, "c-api-wrong-pw"), nullptr) << err.message;
}

// set_step: ranges of the new step from the next range taken on; a bad step changes nothing.
TEST(CApiSegment, SetStepTakesRangesOfTheNewStep) {
  PostgresServer pg;
  const std::string url = pg.url();
  distlock_error err{};
  distlock_segment* a = nullptr;
  ASSERT_EQ(distlock_segment_new(url.c_str(), "capistep", 10, &a, &err), DISTLOCK_OK) << err.message;
  EXPECT_EQ(distlock_segment_set_step(a, -1, &err), DISTLOCK_E_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(err.message, "step"), nullptr) << err.message;
  EXPECT_EQ(distlock_segment_set_step(nullptr, 3, &err), DISTLOCK_E_INVALID_ARGUMENT);
  ASSERT_EQ(distlock_segment_set_step(a, 3, &err), DISTLOCK_OK) << err.message;
  // a took (0, 10] when it was made; its next range is (10, 13]: ids 1..11 come from both.
  std::uint64_t x = 0;
  for (std::uint64_t want = 1; want <= 11; ++want) {
    ASSERT_EQ(distlock_segment_next(a, &x, &err), DISTLOCK_OK) << err.message;
    ASSERT_EQ(x, want);
  }
  // A second generator of the tag starts above a's ranges: at 14 (or 17, had a fetched
  // (13, 16] ahead); with the step of 10 a was made with, it would start at 21 or above.
  distlock_segment* b = nullptr;
  ASSERT_EQ(distlock_segment_new(url.c_str(), "capistep", 0, &b, &err), DISTLOCK_OK) << err.message;
  ASSERT_EQ(distlock_segment_next(b, &x, &err), DISTLOCK_OK) << err.message;
  EXPECT_GE(x, 14u);
  EXPECT_LE(x, 17u);
  distlock_segment_free(b);
  distlock_segment_free(a);
}

}  // namespace
