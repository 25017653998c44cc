// The fixture of the CLI tests that run once on file:// and once on redis://: the test's
// parameter ("file" or "redis") picks a lock directory in the test's temp dir or a
// redis-server of the test's own.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/process.hpp"
#include "support/redis_server.hpp"

namespace distlock::testing {

class FileOrRedisCliTest : public ::testing::TestWithParam<std::string> {
 protected:
  /// `dir_prefix` names the test's temp dir.
  explicit FileOrRedisCliTest(const char* dir_prefix) : dir_(dir_prefix) {}

  void SetUp() override {
    if (redis()) {
      redis_ = std::make_unique<RedisServer>();
      url_ = redis_->url();
    } else {
      url_ = "file://" + (dir_.path() / "locks").string();
    }
  }
  bool redis() const { return GetParam() == "redis"; }
  std::filesystem::path path(const std::string& name) const { return dir_.path() / name; }
  /// `distlock run --url URL <flags...> NAME -- sh -c SCRIPT`
  std::vector<std::string> run_sh(const std::string& name, const std::string& script,
                                  std::vector<std::string> flags = {}) const {
    std::vector<std::string> args{"run", "--url", url_};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {name, "--", "sh", "-c", script});
    return args;
  }

  TempDir dir_;
  std::unique_ptr<RedisServer> redis_;
  std::string url_;
};

}  // namespace distlock::testing
