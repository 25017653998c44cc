// Critical-section logs written by `lock_tool hammer`: parse them and check that no two
// sections overlapped and that fencing tokens increased in section order.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace distlock::testing {

struct Section {
  long pid = 0;
  long tid = 0;
  bool has_token = false;
  std::uint64_t token = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  bool owned_at_end = true;
};

inline std::vector<Section> read_sections(const std::string& path) {
  std::vector<Section> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    Section s;
    std::string token;
    int owned = 1;
    if (!(ls >> s.pid >> s.tid >> token >> s.start_ns >> s.end_ns >> owned)) continue;
    s.has_token = token != "-";
    if (s.has_token) s.token = std::stoull(token);
    s.owned_at_end = owned != 0;
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(),
            [](const Section& a, const Section& b) { return a.start_ns < b.start_ns; });
  return out;
}

/// No section starts before the previous one (in start order) ended.
inline ::testing::AssertionResult no_overlap(const std::vector<Section>& s) {
  for (std::size_t i = 1; i < s.size(); ++i) {
    if (s[i].start_ns < s[i - 1].end_ns) {
      return ::testing::AssertionFailure()
             << "sections overlap: pid " << s[i - 1].pid << "/" << s[i - 1].tid << " [" << s[i - 1].start_ns
             << "," << s[i - 1].end_ns << "] and pid " << s[i].pid << "/" << s[i].tid << " starting at "
             << s[i].start_ns;
    }
  }
  return ::testing::AssertionSuccess();
}

/// Tokens strictly increase in section order (for backends with fencing).
inline ::testing::AssertionResult tokens_increase(const std::vector<Section>& s) {
  for (std::size_t i = 1; i < s.size(); ++i) {
    if (!s[i].has_token || !s[i - 1].has_token)
      return ::testing::AssertionFailure() << "section without a token";
    if (s[i].token <= s[i - 1].token) {
      return ::testing::AssertionFailure() << "token " << s[i].token << " (pid " << s[i].pid
                                           << ") does not exceed the previous section's " << s[i - 1].token;
    }
  }
  return ::testing::AssertionSuccess();
}

inline long read_counter(const std::string& path) {
  std::ifstream in(path);
  long v = -1;
  in >> v;
  return v;
}

}  // namespace distlock::testing
