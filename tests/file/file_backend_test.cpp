// The host-local backend (file:///dir) against real files, threads and processes:
// the record and file layout, contention between threads of one client, waiting by
// notification, bad URLs and directories, odd names' file names, damaged, foreign
// and removed lock files, and that another owner's lock is never touched. The lock
// contract (hammer with dense tokens, killed and stopped holders, reentrancy,
// non-owner unlock) is proven in tests/conformance.
#include "file/file_backend.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/url.hpp"
#include "support/backend_names.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"

namespace distlock::testing {

using namespace std::chrono_literals;
using detail::lock_file_name;
namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

namespace {

std::uint64_t le64(const std::string& s, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

long long ms_since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - t).count();
}

struct FileBackend : ::testing::Test {
  TempDir tmp{"distlock-file"};
  fs::path dir = tmp.path() / "locks" / "nested";  // created by the backend (mkdir -p)
  // Shared with the client's logger: an engine whose last reference was dropped on a
  // backend thread inside a loss signal is destroyed on a thread of its own and may log
  // after this fixture is gone (docs/design.md, "No loss is silent").
  struct LogSink {
    std::mutex mu;
    std::vector<std::string> lines;
  };
  std::shared_ptr<LogSink> sink = std::make_shared<LogSink>();

  // recheck=5s: the engine's fallback re-check is slow, so anything prompt is a notification.
  std::string url(const std::string& query = "recheck=5s") const {
    return "file://" + dir.string() + (query.empty() ? "" : "?" + query);
  }
  distlock::Client client(const std::string& query = "recheck=5s") {
    distlock::ClientOptions o;
    o.logger = [sink = sink](distlock::LogLevel, std::string_view msg) {
      std::lock_guard lk(sink->mu);
      sink->lines.emplace_back(msg);
    };
    return distlock::connect(url(query), o);
  }
  bool logged(const std::string& needle) {
    std::lock_guard lk(sink->mu);
    for (const auto& l : sink->lines) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
  fs::path file_of(const std::string& name) const { return dir / lock_file_name(name); }
  std::string out_file(const std::string& tag) const { return (tmp.path() / (tag + ".out")).string(); }

  static distlock::LockOptions wait_for(Millis w) {
    distlock::LockOptions o;
    o.wait = w;
    return o;
  }
};

// Expects `fn` to throw std::system_error with `code` and a message containing `part`.
template <class Fn>
void expect_error(Fn&& fn, errc code, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected " << distlock::make_error_code(code).message() << " naming " << part;
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), distlock::make_error_code(code)) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << part << "\"";
  }
}

TEST_F(FileBackend, AcquireReleaseStatusAndFileLayout) {
  auto c = client();
  EXPECT_TRUE(c.has_fencing());
  EXPECT_EQ(c.scheme(), "file");
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);  // created 0700

  distlock::LockInfo before = c.status("orders/42");
  EXPECT_FALSE(before.held);
  EXPECT_EQ(before.token.value_or(99), 0u);
  {
    distlock::Lease lease = c.acquire("orders/42");
    ASSERT_TRUE(lease.owns());
    EXPECT_EQ(lease.token(), 1u);
    EXPECT_EQ(lease.remaining(), Millis::max());  // no TTL on this backend

    distlock::LockInfo info = c.status("orders/42");
    EXPECT_TRUE(info.held);
    EXPECT_EQ(info.token, 1u);
    ASSERT_TRUE(info.holder.has_value());
    EXPECT_EQ(info.holder->rfind(c.id() + ":", 0), 0u) << *info.holder;
    EXPECT_NE(info.holder->find("(pid " + std::to_string(::getpid()) + ")"), std::string::npos)
        << *info.holder;
    EXPECT_FALSE(info.ttl_remaining.has_value());

    // The record inside the file: magic, token, pid, owner id, the full name.
    const std::string bytes = read_file(file_of("orders/42"));
    ASSERT_GE(bytes.size(), 40u);
    EXPECT_EQ(bytes.substr(0, 8), std::string("DLOCKF1\n"));
    EXPECT_EQ(le64(bytes, 8), 1u);
    EXPECT_EQ(le64(bytes, 16), static_cast<std::uint64_t>(::getpid()));
    EXPECT_NE(bytes.find(c.id()), std::string::npos);
    EXPECT_EQ(bytes.substr(40, 9), "orders/42");
    EXPECT_EQ(bytes.substr(49).rfind(c.id() + ":", 0), 0u);
    EXPECT_EQ(fs::status(file_of("orders/42")).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write);
  }
  distlock::LockInfo after = c.status("orders/42");
  EXPECT_FALSE(after.held);
  EXPECT_EQ(after.token, 1u);
  EXPECT_FALSE(after.holder.has_value());
  EXPECT_TRUE(fs::exists(file_of("orders/42")));  // kept: it carries the token counter

  distlock::Lease again = c.acquire("orders/42");
  EXPECT_EQ(again.token(), 2u);
  EXPECT_EQ(c.stats().acquired, 2u);
  EXPECT_EQ(c.stats().released, 1u);
}

TEST_F(FileBackend, TwoThreadsOfOneClientContend) {
  auto c = client();
  distlock::Lease first = c.acquire("shared");
  std::atomic<bool> released{false};
  std::promise<std::uint64_t> second_token;
  std::thread other([&] {
    // Another thread is another owner: one attempt fails, a wait blocks.
    EXPECT_FALSE(c.try_acquire("shared").has_value());
    distlock::Lease lease = c.acquire("shared", wait_for(20s));
    EXPECT_TRUE(released.load()) << "second thread acquired while the first still held the lock";
    second_token.set_value(lease.token());
  });
  std::this_thread::sleep_for(300ms);
  auto fut = second_token.get_future();
  EXPECT_EQ(fut.wait_for(0s), std::future_status::timeout);
  released = true;
  const std::uint64_t t1 = first.token();
  first.release();
  ASSERT_EQ(fut.wait_for(10s), std::future_status::ready);
  EXPECT_GT(fut.get(), t1);
  other.join();
}

TEST_F(FileBackend, WaiterWakesByNotificationFromAnotherClient) {
  auto holder = client();
  auto waiter = client();  // its own backend: woken by inotify, not by the engine's local shortcut
  for (int round = 0; round < 3; ++round) {
    distlock::Lease held = holder.acquire("n");
    std::promise<void> acquired;
    std::thread t([&] {
      distlock::Lease lease = waiter.acquire("n", wait_for(30s));
      acquired.set_value();
    });
    std::this_thread::sleep_for(200ms);  // the waiter is asleep by now
    const auto released_at = SteadyClock::now();
    held.release();
    ASSERT_EQ(acquired.get_future().wait_for(20s), std::future_status::ready);
    const long long took = ms_since(released_at);
    t.join();
    // The fallback re-check is 5 s away; a notification takes milliseconds. 2 s of slack for a busy machine.
    EXPECT_LT(took, 2000) << "round " << round << ": waiter took " << took << " ms after the release";
  }
}

TEST_F(FileBackend, WaitersDoNotWakeEachOther) {
  // Every failed attempt closes the lock file, which posts a close event to every
  // other waiter. Those must not wake waiters into new attempts (and new events):
  // 8 clients waiting 2 s with a 100 ms fallback re-check stay nearly idle.
  auto holder = client();
  distlock::Lease held = holder.acquire("herd");
  std::vector<distlock::Client> waiters;
  waiters.reserve(8);
  for (int i = 0; i < 8; ++i) waiters.push_back(client("recheck=100ms"));
  auto cpu_seconds = [] {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  };
  const double cpu_before = cpu_seconds();
  std::vector<std::thread> threads;
  threads.reserve(waiters.size());
  std::atomic<int> timeouts{0};
  for (auto& w : waiters) {
    threads.emplace_back([&] {
      Error ec;
      distlock::Lease l = w.acquire("herd", wait_for(2s), ec);
      if (ec == errc::timeout) ++timeouts;
    });
  }
  for (auto& t : threads) t.join();
  const double cpu = cpu_seconds() - cpu_before;
  EXPECT_EQ(timeouts.load(), 8);
  // A wake-up loop would burn the whole 2 s on each core; 20 re-checks per waiter cost milliseconds.
  EXPECT_LT(cpu, 0.5) << "waiting used " << cpu << " s of CPU";
}

TEST_F(FileBackend, WaiterWakesWhenHolderProcessReleases) {
  const std::string out = out_file("holder");
  Process p = spawn_holder(url(), "x", out, 2000);
  ASSERT_TRUE(wait_for_text(out, "acquired", 20s)) << read_file(out);
  auto c = client();
  std::promise<std::uint64_t> token;
  std::thread t([&] { token.set_value(c.acquire("x", wait_for(30s)).token()); });
  std::this_thread::sleep_for(300ms);
  auto fut = token.get_future();
  EXPECT_EQ(fut.wait_for(0s), std::future_status::timeout);
  const auto asked = SteadyClock::now();
  p.signal(SIGTERM);  // lock_tool releases and exits
  ASSERT_EQ(fut.wait_for(20s), std::future_status::ready);
  EXPECT_LT(ms_since(asked), 2000);
  EXPECT_GT(fut.get(), static_cast<std::uint64_t>(acquired_token(out)));
  t.join();
  EXPECT_TRUE(wait_for_text(out, "released", 10s));
}

TEST_F(FileBackend, MalformedUrlsNameTheirPart) {
  const std::string d = dir.string();
  expect_error([&] { distlock::connect("file://somehost" + d); }, errc::invalid_url, "host \"somehost\"");
  expect_error([&] { distlock::connect("file://relative/dir"); }, errc::invalid_url, "relative");
  expect_error([&] { distlock::connect("file://"); }, errc::invalid_url, "no directory");
  // A user info without ':' may be a password written alone, so connect() masks it wherever
  // it appears in a message (docs/design.md "Secrets"): the word "user" itself would be masked
  // in "has user info", hence another name here.
  expect_error([&] { distlock::connect("file://alice@" + d); }, errc::invalid_url, "user info");
  try {
    distlock::connect("file://alice@" + d);
  } catch (const std::system_error& e) {
    EXPECT_EQ(std::string(e.what()).find("alice"), std::string::npos) << e.what();
  }
  expect_error([&] { distlock::connect("file:" + d); }, errc::invalid_url, "no scheme");
  expect_error([&] { distlock::connect("file://" + d + "?colour=blue"); }, errc::invalid_url, "\"colour\"");
  expect_error([&] { distlock::connect("file://" + d + "?recheck=soon"); }, errc::invalid_url,
               "recheck \"soon\"");
  expect_error([&] { distlock::connect("file://" + d + "?recheck=0"); }, errc::invalid_url, "recheck \"0\"");
  expect_error([&] { distlock::connect("file://" + d + "?sync=maybe"); }, errc::invalid_url,
               "sync \"maybe\"");
  EXPECT_FALSE(fs::exists(dir)) << "a rejected URL must not create its directory";
  // Accepted forms: trailing slash, "..", known keys.
  auto c = distlock::connect("file://" + (tmp.path() / "a" / ".." / "b").string() + "/?sync=true&timeout=1s");
  EXPECT_EQ(c.acquire("x").token(), 1u);
  EXPECT_TRUE(fs::exists(tmp.path() / "b" / lock_file_name("x")));
}

TEST_F(FileBackend, DirectoryProblemsAreClearErrors) {
  const fs::path plain = tmp.path() / "plain-file";
  std::ofstream(plain) << "not a directory";
  expect_error([&] { distlock::connect("file://" + plain.string()); }, errc::invalid_url,
               "is not a directory");
  expect_error([&] { distlock::connect("file://" + (plain / "sub").string()); }, errc::invalid_url,
               "not a directory");
  // Cannot be created (no such parent in /proc, even for root).
  expect_error([&] { distlock::connect("file:///proc/distlock-no-such-dir/locks"); },
               errc::backend_unavailable, "cannot create lock directory");
  if (::geteuid() == 0) {
    // Root may write everywhere except on pseudo file systems: sysfs refuses new files.
    expect_error([&] { distlock::connect("file:///sys/kernel"); }, errc::backend_unavailable,
                 "is not writable");
    // A world-writable directory owned by somebody else is refused.
    const fs::path foreign = tmp.path() / "foreign";
    fs::create_directory(foreign);
    ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
    fs::permissions(foreign, fs::perms::all);
    expect_error([&] { distlock::connect("file://" + foreign.string()); }, errc::backend_unavailable,
                 "writable by every user");
  } else {
    const fs::path ro = tmp.path() / "read-only";
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    expect_error([&] { distlock::connect("file://" + ro.string()); }, errc::backend_unavailable,
                 "is not writable");
    fs::permissions(ro, fs::perms::owner_all);
    expect_error([&] { distlock::connect("file:///tmp"); }, errc::backend_unavailable,
                 "writable by every user");
  }
}

// Like ssh's StrictModes: a lock directory (or a directory above it) that another user
// owns, or that its group or every user may write, lets somebody else remove, replace or
// forge lock files and tokens. Each is refused at connect, naming the path and the problem.
TEST_F(FileBackend, DirectoryOthersCanWriteOrOwnIsRefused) {
  const fs::path base = tmp.path() / "strict";
  fs::create_directory(base);
  fs::permissions(base, fs::perms::owner_all, fs::perm_options::replace);
  const fs::path d = base / "locks";
  fs::create_directory(d);
  fs::permissions(d, fs::perms::owner_all, fs::perm_options::replace);
  distlock::connect("file://" + d.string());  // 0700, ours: accepted

  fs::permissions(d, fs::perms::all, fs::perm_options::replace);  // 0777
  expect_error([&] { distlock::connect("file://" + d.string()); }, errc::backend_unavailable,
               "\"" + d.string() + "\" is writable by every user");
  fs::permissions(d, fs::perms::owner_all | fs::perms::group_all, fs::perm_options::replace);  // 0770
  expect_error([&] { distlock::connect("file://" + d.string()); }, errc::backend_unavailable,
               "\"" + d.string() + "\" is writable by its group");
  fs::permissions(d, fs::perms::all | fs::perms::sticky_bit, fs::perm_options::replace);  // 1777
  expect_error([&] { distlock::connect("file://" + d.string()); }, errc::backend_unavailable,
               "writable by every user");
  fs::permissions(d, fs::perms::owner_all, fs::perm_options::replace);

  // A parent others may write without the sticky bit could rename the lock directory away.
  fs::permissions(base, fs::perms::all, fs::perm_options::replace);
  expect_error([&] { distlock::connect("file://" + d.string()); }, errc::backend_unavailable,
               "\"" + base.string() + "\" is writable by every user");
  fs::permissions(base, fs::perms::all | fs::perms::sticky_bit, fs::perm_options::replace);  // like /tmp
  distlock::connect("file://" + d.string());
  fs::permissions(base, fs::perms::owner_all, fs::perm_options::replace);

  if (::geteuid() == 0) {
    // Owned by another user (nobody), even with mode 0755: refused.
    ASSERT_EQ(::chown(d.c_str(), 65534, 65534), 0);
    fs::permissions(d,
                    fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                        fs::perms::others_read | fs::perms::others_exec,
                    fs::perm_options::replace);
    expect_error([&] { distlock::connect("file://" + d.string()); }, errc::backend_unavailable,
                 "\"" + d.string() + "\" is owned by uid 65534");
    ASSERT_EQ(::chown(d.c_str(), 0, 0), 0);
    distlock::connect("file://" + d.string());
    // A parent owned by another user: refused too.
    ASSERT_EQ(::chown(base.c_str(), 65534, 65534), 0);
    expect_error([&] { distlock::connect("file://" + d.string()); }, errc::backend_unavailable,
                 "\"" + base.string() + "\" is owned by uid 65534");
    ASSERT_EQ(::chown(base.c_str(), 0, 0), 0);
  }
}

// A lock file another user owns (planted before us) is never used: it could be opened
// and unlocked, or its token forged, by that user.
TEST_F(FileBackend, LockFileNotOwnedByCallerOrRootIsRefused) {
  auto c = client();
  c.acquire("planted").release();
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(file_of("planted").c_str(), 65534, 65534), 0);
    expect_error([&] { c.acquire("planted", wait_for(0ms)); }, errc::backend_unavailable, "planted");
    EXPECT_TRUE(logged(file_of("planted").string() + " is owned by uid 65534"))
        << "the log names file and owner";
    Error ec;
    (void)c.status("planted", ec);
    EXPECT_EQ(ec, errc::backend_unavailable);
    ASSERT_EQ(::chown(file_of("planted").c_str(), 0, 0), 0);
    EXPECT_EQ(c.acquire("planted").token(), 2u);
  }
  // Not a regular file (a directory at the lock file's path): refused, named.
  fs::create_directory(file_of("a-dir"));
  expect_error([&] { c.acquire("a-dir", wait_for(0ms)); }, errc::backend_unavailable, "a-dir");
  // A symbolic link is never followed.
  fs::create_symlink(tmp.path() / "elsewhere", file_of("linked"));
  expect_error([&] { c.acquire("linked", wait_for(0ms)); }, errc::backend_unavailable, "linked");
  EXPECT_FALSE(fs::exists(tmp.path() / "elsewhere"));
}

// A forged record holding the largest token: the next token would wrap to 0, below
// every token issued before. Refused (exhausted), the file kept as it is.
TEST_F(FileBackend, TokenAtItsMaximumIsRefusedNeverWrapped) {
  auto c = client();
  c.acquire("forged").release();
  std::string rec = read_file(file_of("forged"));
  ASSERT_GE(rec.size(), 16u);
  for (int i = 0; i < 8; ++i) rec[8 + i] = '\xff';  // token 2^64-1
  std::ofstream(file_of("forged"), std::ios::binary | std::ios::trunc) << rec;
  expect_error([&] { c.acquire("forged", wait_for(0ms)); }, errc::exhausted, "forged");
  EXPECT_TRUE(logged(file_of("forged").string())) << "the log names the file";
  EXPECT_EQ(le64(read_file(file_of("forged")), 8), ~std::uint64_t{0});
  EXPECT_FALSE(c.status("forged").held);
  // One below the maximum is still issued.
  rec[8] = '\xfe';
  std::ofstream(file_of("forged"), std::ios::binary | std::ios::trunc) << rec;
  EXPECT_EQ(c.acquire("forged").token(), ~std::uint64_t{0});
}

TEST_F(FileBackend, OddNamesWork) {
  auto c = client();
  const std::vector<std::string> names = {"line\r\nbreak",
                                          "with spaces",
                                          "a/b/../c",
                                          "..",
                                          ".",
                                          "/",
                                          "%41",
                                          "A",
                                          "\xc3\xbc-utf8",
                                          "\x01\x7f\xff binary",
                                          ".hidden",
                                          "x.lock",
                                          std::string(4096, 'n'),
                                          std::string(4095, 'n') + "m",
                                          std::string(1000, '/')};
  std::vector<distlock::Lease> leases;
  for (const auto& n : names) {
    distlock::Lease l = c.acquire(n, wait_for(0ms));  // all distinct files: none is busy
    EXPECT_EQ(l.token(), 1u) << "name of " << n.size() << " bytes";
    leases.push_back(std::move(l));
  }
  for (const auto& n : names) EXPECT_TRUE(c.status(n).held) << "name of " << n.size() << " bytes";
  leases.clear();
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_TRUE(e.is_regular_file()) << e.path();
    EXPECT_LE(e.path().filename().string().size(), 255u);
    EXPECT_NE(e.path().filename().string().front(), '.') << e.path();
    ++files;
  }
  EXPECT_EQ(files, names.size());
  // Long names are hashed; the full name stays inside the file for status and checks.
  EXPECT_EQ(lock_file_name(std::string(4096, 'n')).size(), 64u + 6u);
  EXPECT_NE(read_file(file_of(std::string(4096, 'n'))).find(std::string(4096, 'n')), std::string::npos);
  EXPECT_EQ(lock_file_name("a b/c"), "a%20b%2Fc.lock");
  EXPECT_EQ(lock_file_name(".."), "%2E..lock");
}

TEST_F(FileBackend, AnotherOwnersLockIsNeverTouched) {
  const std::string out = out_file("holder");
  Process p = spawn_holder(url(), "theirs", out, 2000);
  ASSERT_TRUE(wait_for_text(out, "acquired", 20s)) << read_file(out);
  const std::string before = read_file(file_of("theirs"));
  {
    auto c = client();
    EXPECT_FALSE(c.try_acquire("theirs").has_value());
    Error ec;
    c.mutex("theirs").unlock(ec);
    EXPECT_EQ(ec, errc::not_owner);
    distlock::Lease none = c.acquire("theirs", wait_for(200ms), ec);
    EXPECT_EQ(ec, errc::timeout);
    EXPECT_TRUE(c.status("theirs").held);
  }  // our client goes away too: nothing of theirs is released
  EXPECT_EQ(read_file(file_of("theirs")), before);
  p.signal(SIGUSR1);
  EXPECT_TRUE(wait_for_text(out, "owns 1", 10s)) << read_file(out);
  auto c = client();
  EXPECT_TRUE(c.status("theirs").held);
}

TEST_F(FileBackend, RemovedLockFileIsALoss) {
  auto c = client();
  // Held before: the client keeps idle watches of recently held files and reuses them.
  c.acquire("gone").release();
  distlock::Lease lease = c.acquire("gone");
  std::atomic<bool> callback{false};
  lease.on_lost([&] { callback = true; });
  fs::remove(file_of("gone"));
  const auto start = SteadyClock::now();
  while (!lease.stop_token().stop_requested() && ms_since(start) < 5000) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(lease.stop_token().stop_requested()) << "no loss signal after the lock file was removed";
  // The stop token is requested on the thread that saw the loss; the on_lost callbacks
  // run after it on the client's event thread: wait (bounded, 5 s) for the callback too.
  for (int i = 0; i < 500 && !callback.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(callback.load());
  EXPECT_FALSE(lease.owns());
  // Somebody else can now take a fresh file (its counter restarts: see the docs).
  auto other = client();
  EXPECT_TRUE(other.try_acquire("gone").has_value());
  Error ec;
  lease.release(ec);
  EXPECT_EQ(ec, errc::lost);
  EXPECT_EQ(c.stats().lost, 1u);
}

TEST_F(FileBackend, RemovalIsALossAfterManyOtherLocks) {
  // More names than the client keeps idle watches for (1024): the oldest are
  // dropped, and a lock taken again is watched again.
  auto c = client();
  c.acquire("first").release();
  for (int i = 0; i < 1100; ++i) c.acquire("k" + std::to_string(i)).release();
  distlock::Lease lease = c.acquire("first");
  fs::remove(file_of("first"));
  const auto start = SteadyClock::now();
  while (!lease.stop_token().stop_requested() && ms_since(start) < 5000) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(lease.stop_token().stop_requested()) << "no loss signal after the lock file was removed";
}

TEST_F(FileBackend, DamagedLockFileIsRefusedAndKept) {
  auto c = client();
  (void)c.status("x");  // the directory exists now
  std::ofstream(file_of("damaged"), std::ios::binary) << "somebody else's data";
  const std::string before = read_file(file_of("damaged"));
  expect_error([&] { c.acquire("damaged"); }, errc::protocol_error, "damaged");
  EXPECT_TRUE(logged(lock_file_name("damaged"))) << "the log should name the file";
  EXPECT_TRUE(logged("not a distlock lock file"));
  EXPECT_EQ(read_file(file_of("damaged")), before);
  Error ec;
  (void)c.status("damaged", ec);
  EXPECT_EQ(ec, errc::protocol_error);
  // A record of another name (as a hash collision would leave) is refused too.
  c.acquire("right").release();
  fs::copy_file(file_of("right"), file_of("wrong"));
  expect_error([&] { c.acquire("wrong"); }, errc::protocol_error, "wrong");
  EXPECT_TRUE(logged("belongs to another lock name"));
}

TEST_F(FileBackend, BackendChecksOwnerTokenAndInode) {
  // The adapter directly: renew and release are owner-, token- and inode-checked.
  detail::Url u;
  Error ec;
  ASSERT_FALSE(ec = detail::parse_url(url(), u)) << ec.detail();
  auto backend = detail::make_file_backend(u, {}, ec);
  ASSERT_TRUE(backend) << ec.detail();
  EXPECT_TRUE(backend->capabilities().fencing);
  EXPECT_FALSE(backend->capabilities().needs_renewal);
  const AcquireRequest req{"b", "owner-1", Millis(1000)};
  auto got = backend->try_acquire(req, ec);
  ASSERT_FALSE(ec);
  ASSERT_TRUE(got.acquired);
  const AcquireRequest other{"b", "owner-2", Millis(1000)};
  auto busy = backend->try_acquire(other, ec);
  EXPECT_FALSE(ec);
  EXPECT_FALSE(busy.acquired);
  EXPECT_TRUE(busy.holder_ttl.has_value());  // the re-check hint

  const std::vector<RenewItem> items = {{"b", "owner-1", got.token, Millis(1000)},
                                        {"b", "owner-2", got.token, Millis(1000)},
                                        {"b", "owner-1", got.token + 1, Millis(1000)}};
  std::vector<RenewStatus> out(items.size(), RenewStatus::failed);
  backend->renew(items, out, ec);
  EXPECT_EQ(out[0], RenewStatus::renewed);
  EXPECT_EQ(out[1], RenewStatus::not_owner);
  EXPECT_EQ(out[2], RenewStatus::not_owner);

  EXPECT_EQ(backend->release("b", "owner-2", got.token, ec), ReleaseStatus::not_owner);
  EXPECT_EQ(backend->release("b", "owner-1", got.token + 1, ec), ReleaseStatus::not_owner);
  EXPECT_TRUE(backend->status("b", ec).held);  // neither touched the lock

  fs::remove(file_of("b"));
  backend->renew(std::span(items).first(1), std::span(out).first(1), ec);
  EXPECT_EQ(out[0], RenewStatus::not_owner);  // the file is gone: lost
  EXPECT_EQ(backend->release("b", "owner-1", got.token, ec), ReleaseStatus::not_owner);
  EXPECT_FALSE(ec);
  EXPECT_EQ(backend->release("b", "owner-1", got.token, ec), ReleaseStatus::not_owner);
}

TEST_F(FileBackend, DefaultUrlUsesTheRuntimeDirectory) {
  ::unsetenv("DISTLOCK_URL");
  ASSERT_EQ(::setenv("XDG_RUNTIME_DIR", tmp.path().c_str(), 1), 0);
  EXPECT_EQ(distlock::default_url(), "file://" + tmp.path().string() + "/distlock");
  auto c = distlock::connect("");
  EXPECT_EQ(c.url(), "file://" + tmp.path().string() + "/distlock");
  EXPECT_EQ(c.acquire("d").token(), 1u);
  EXPECT_TRUE(fs::exists(tmp.path() / "distlock" / lock_file_name("d")));
  ::unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(distlock::default_url(), "file:///tmp/distlock-" + std::to_string(::getuid()));
}

}  // namespace

}  // namespace distlock::testing
