// A record outlives its writer killed mid-write, through the internal Backend made by the
// backend's own factory: the case the file://, mysql:// and postgres:// records tests share.
//
//   backend_of(url, factory)   a quiet backend for `url` (EXPECTs the URL parses and it is made)
//   expect_record_survives_its_writer_killed(url, factory, tmp_name, settled[, rounds, step])
//
// Thread-safety: each call uses only its arguments; the second forks, so it runs before the
// test starts any thread of its own.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/url.hpp"
#include "support/backend_records.hpp"
#include "support/client_options.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"

namespace distlock::testing {

/// A backend's factory: detail::make_mysql_backend, detail::make_postgres_backend, detail::make_file_backend.
using BackendFactory = std::unique_ptr<detail::Backend> (*)(const detail::Url&, const ClientOptions&,
                                                            detail::Error&);

/// `factory`'s backend for `url`, quiet (EXPECTs the URL parses and the backend is made).
inline std::unique_ptr<detail::Backend> backend_of(const std::string& url, BackendFactory factory) {
  detail::Url u;
  detail::Error ec;
  EXPECT_FALSE(ec = detail::parse_url(url, u)) << ec.detail();
  auto b = factory(u, quiet(), ec);
  EXPECT_TRUE(b) << ec.message() << ": " << ec.detail();
  return b;
}

/// A writer process SIGKILLed while it overwrites a record again and again (values of
/// kMaxRecordValue and 40,000 bytes), `rounds` rounds, round r killed r * `step` after its
/// fourth write was seen (a different moment each round), leaves a whole value, which an if_absent put
/// then returns. `settled()` runs after each kill, before the record is read: where the server
/// may still run the dead writer's last batch, it waits for that session to end. Forks: call it
/// before the test starts any thread of its own.
inline void expect_record_survives_its_writer_killed(
    const std::string& url, BackendFactory factory, const std::string& tmp_name,
    const std::function<void()>& settled, int rounds = 4,
    std::chrono::microseconds step = std::chrono::milliseconds(7)) {
  using namespace std::chrono_literals;
  using detail::PutMode;
  const std::string va(detail::kMaxRecordValue, 'a');
  const std::string vb(40000, 'b');
  TempDir tmp(tmp_name);
  const std::string marker = (tmp.path() / "started").string();
  for (int round = 0; round < rounds; ++round) {
    std::filesystem::remove(marker);
    const pid_t pid = ::fork();  // no thread of ours runs yet: backends are made after
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      detail::Url u;
      detail::Error ec;
      if (detail::parse_url(url, u)) ::_exit(2);
      auto b = factory(u, quiet(), ec);
      if (!b) ::_exit(3);
      for (long n = 0; n < 1'000'000; ++n) {
        b->put_record("survivor", n % 2 ? vb : va, PutMode::always, ec);
        if (ec) ::_exit(4);
        if (n == 3) std::ofstream(marker) << "x";
      }
      ::_exit(0);
    }
    ASSERT_TRUE(eventually([&] { return std::filesystem::exists(marker); }, 60s)) << "the writer never wrote";
    std::this_thread::sleep_for(round * step);  // a different moment each round
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself: " << status;
    ASSERT_NO_FATAL_FAILURE(settled());
    auto b = backend_of(url, factory);
    auto v = get(*b, "survivor");
    ASSERT_TRUE(v.has_value());
    EXPECT_TRUE(*v == va || *v == vb) << "a value of " << v->size() << " bytes";
    EXPECT_EQ(put(*b, "survivor", "next", PutMode::if_absent), *v);
  }
}

}  // namespace distlock::testing
