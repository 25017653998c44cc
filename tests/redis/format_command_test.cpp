// redis::format_command (redis/connection.hpp): the RESP it writes is byte for byte what
// hiredis's redisFormatCommandArgv writes, for empty, binary, long and many arguments, and
// it appends to what the buffer held.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <string_view>
#include <vector>

#include "redis/connection.hpp"

namespace distlock::testing {
namespace {

std::string hiredis_format(const std::vector<std::string_view>& argv) {
  std::vector<const char*> p;
  std::vector<size_t> l;
  for (auto a : argv) {
    p.push_back(a.data());
    l.push_back(a.size());
  }
  char* cmd = nullptr;
  const int n = redisFormatCommandArgv(&cmd, static_cast<int>(argv.size()), p.data(), l.data());
  EXPECT_GE(n, 0);
  std::string out(cmd, static_cast<std::size_t>(n));
  redisFreeCommand(cmd);
  return out;
}

TEST(RedisFormatCommand, WritesWhatHiredisWrites) {
  using namespace std::string_view_literals;
  const std::string big(100000, 'x');
  const std::string binary("a\0b\r\n$*\xff"sv);
  std::vector<std::string> many;
  for (int i = 0; i < 300; ++i) many.push_back(std::to_string(i * 7919));
  std::vector<std::vector<std::string_view>> cases = {
      {"PING"},
      {"SET", "k", "v", "PX", "5000", "NX"},
      {"EVALSHA", "58e08dfc4989dff4565cee7b9d793d80ccb9bbad", "4", "distlock:{a}", "distlock:{a}:q",
       "distlock:{a}:qx", "distlock:{15}:fence", "owner 1", "30000", "7", "1", "distlock:grant:", "0"},
      {"SET", "", ""},
      {"SET", binary, big},
      {},
  };
  cases.emplace_back(many.begin(), many.end());
  for (const auto& argv : cases) {
    std::string out;
    ASSERT_TRUE(distlock::detail::redis::format_command(out, argv));
    EXPECT_EQ(out, hiredis_format(argv)) << argv.size() << " arguments";
  }
  // Appends: two commands in one buffer are the two formats one after the other.
  std::string both = "already";
  ASSERT_TRUE(distlock::detail::redis::format_command(both, cases[0]));
  ASSERT_TRUE(distlock::detail::redis::format_command(both, cases[1]));
  EXPECT_EQ(both, "already" + hiredis_format(cases[0]) + hiredis_format(cases[1]));
}

}  // namespace
}  // namespace distlock::testing
