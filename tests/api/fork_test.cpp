// fork() on a real backend: a child inherits the parent's open lock files (the same
// open file descriptions), so a release from the child would free the parent's
// kernel lock. The engine refuses every call in the child instead.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "distlock/distlock.hpp"

using namespace std::chrono_literals;
using distlock::errc;

namespace {

TEST(Fork, ChildCannotReleaseOrTakeItsParentsFileLock) {
  char tmpl[] = "/tmp/distlock-fork-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string url = std::string("file://") + tmpl;
  auto parent = distlock::connect(url);
  auto lease = parent.acquire("job");
  ASSERT_TRUE(lease.owns());

  const pid_t pid = ::fork();
  if (pid == 0) {
    std::error_code ec;
    lease.release(ec);  // must be refused: the lock is the parent's
    const int released = ec == errc::forked ? 0 : 1;
    auto again = parent.acquire("job", {}, ec);  // must be refused, not re-entered
    ::_exit(released + (ec == errc::forked ? 0 : 2));
  }
  int status = 0;
  for (int i = 0; i < 2000 && ::waitpid(pid, &status, WNOHANG) != pid; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(WIFEXITED(status)) << "child hung or crashed";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the child released, 2: the child acquired";

  // Another client (another open file description) still finds the lock held.
  auto other = distlock::connect(url);
  EXPECT_FALSE(other.try_acquire("job").has_value()) << "the parent's lock was freed by its child";
  EXPECT_TRUE(lease.owns());
  lease.release();
  EXPECT_TRUE(other.try_acquire("job").has_value());
  std::filesystem::remove_all(tmpl);
}

}  // namespace
