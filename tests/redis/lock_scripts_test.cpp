// redis/lock_scripts.cpp: how each lock script is put together from the prelude's parts.
// Every function (and shared variable) a script uses is defined in that script before its
// first use: a name used before its `local` would be a global, which Redis refuses at run
// time on the path that reaches it. The acquire and release scripts define the queue's
// functions only after their uncontended path has returned (a function defined is a closure
// made on every call; docs/benchmarks.md "The lock scripts' per-call prelude"). No server:
// the scripts' text only (what they do is tested against a server by the scripts' state
// tests, the hand-off tests and the conformance suite).
#include "redis/lock_scripts.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace distlock::testing {
namespace {

namespace rs = distlock::detail::redis;

// The script's code without its comments, with every string literal emptied ('' stays):
// names in comments or strings are no uses.
std::string code_of(const std::string& lua) {
  std::string out;
  for (std::size_t i = 0; i < lua.size();) {
    if (lua.compare(i, 2, "--") == 0) {
      i = lua.find('\n', i);
      if (i == std::string::npos) break;
      continue;
    }
    if (lua[i] == '\'' || lua[i] == '"') {
      const char quote = lua[i++];
      while (i < lua.size() && lua[i] != quote) i += lua[i] == '\\' ? 2 : 1;
      ++i;
      out += "''";
      continue;
    }
    out += lua[i++];
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> all_scripts() {
  return {
      {"queue_acquire", rs::queue_acquire_script().source()},
      {"queue_release", rs::queue_release_script().source()},
      {"queue_cancel", rs::queue_cancel_script().source()},
      {"queue_forget", rs::queue_forget_script().source()},
      {"queue_refresh", rs::queue_refresh_script().source()},
      {"cluster_queue_acquire", rs::cluster_queue_acquire_script().source()},
      {"cluster_queue_release", rs::cluster_queue_release_script().source()},
      {"cluster_queue_cancel", rs::cluster_queue_cancel_script().source()},
      {"cluster_queue_forget", rs::cluster_queue_forget_script().source()},
      {"cluster_queue_refresh", rs::cluster_queue_refresh_script().source()},
      {"queue_status", rs::queue_status_script().source()},
      {"revoke", rs::revoke_script().source()},
  };
}

// The names the prelude defines: every `local function` of any lock script, and the shared
// variables of the prelude.
std::set<std::string> prelude_names() {
  std::set<std::string> names = {"TIME", "WATCHED", "KPER", "ENTRY_LIFE", "CLAIM"};
  const std::regex def(R"(local function (\w+))");
  for (const auto& [script, src] : all_scripts()) {
    const std::string code = code_of(src);
    for (std::sregex_iterator it(code.begin(), code.end(), def), end; it != end; ++it) names.insert((*it)[1]);
  }
  return names;
}

// Where `name` is defined in `code` (`local function name` or `local name`), npos if nowhere.
std::size_t definition_of(const std::string& code, const std::string& name) {
  std::smatch m;
  if (std::regex_search(code, m, std::regex("local (function )?" + name + R"(\b)"))) {
    return static_cast<std::size_t>(m.position(0));
  }
  return std::string::npos;
}

TEST(RedisLockScripts, EveryScriptDefinesEachNameItUsesBeforeItsFirstUse) {
  const std::set<std::string> names = prelude_names();
  ASSERT_GE(names.size(), 20u) << "the prelude's functions were not found";
  int uses = 0;
  for (const auto& [script, src] : all_scripts()) {
    const std::string code = code_of(src);
    for (const std::string& name : names) {
      const std::size_t defined = definition_of(code, name);
      const std::regex use(R"((^|[^\w.]))" + name + R"(\b)");
      for (std::sregex_iterator it(code.begin(), code.end(), use), end; it != end; ++it) {
        ++uses;
        const auto at = static_cast<std::size_t>(it->position(0));
        EXPECT_TRUE(defined != std::string::npos && defined <= at)
            << script << " uses " << name << " at offset " << at
            << (defined == std::string::npos ? " and never defines it" : " before defining it");
      }
    }
  }
  EXPECT_GT(uses, 100);
}

// The uncontended acquire (a name nobody holds, waits for or holds back) and the release
// nobody waits for return before the queue's functions are defined; the acquire's `take`
// is defined before that return.
TEST(RedisLockScripts, TheUncontendedPathsReturnBeforeTheQueueFunctionsAreDefined) {
  const std::pair<std::string, std::string> fast_returns[] = {
      {rs::queue_acquire_script().source(), "return {1, take("},
      {rs::cluster_queue_acquire_script().source(), "return {1, take("},
      {rs::queue_release_script().source(), "send_released(channel)\n  return 0"},
      {rs::cluster_queue_release_script().source(), "send_released(channel)\n  return 0"},
  };
  for (const auto& [src, fast_return] : fast_returns) {
    const std::string code = code_of(src);
    const std::size_t ret = code.find(fast_return);
    ASSERT_NE(ret, std::string::npos) << "no uncontended return (" << fast_return << ") in\n" << src;
    for (const std::string name :
         {"prune", "entry_value", "hold_back", "grant_head", "keep_queue", "release_onward"}) {
      const std::size_t defined = definition_of(code, name);
      EXPECT_TRUE(defined == std::string::npos || defined > ret)
          << name << " is defined before " << fast_return;
    }
  }
}

}  // namespace
}  // namespace distlock::testing
