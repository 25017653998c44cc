// Records and the listing of held locks on the host-local backend (file:///dir),
// through the backend adapter: put (always / if_absent, raced by two processes),
// get, erase, binary values and the 64 KiB bound, a record and a lock of one name
// side by side, records surviving a writer killed mid-write, a fenced put that gives up
// (after the command timeout) on the records directory's flock held by a stopped process,
// and list_held with its prefix, limit and truncation, leaving out released locks and
// killed holders.
#include "file/file_records.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.hpp"
#include "engine/url.hpp"
#include "file/file_backend.hpp"
#include "support/backend_names.hpp"
#include "support/backend_records.hpp"
#include "support/lock_tool.hpp"
#include "support/process.hpp"
#include "support/record_writer_killed.hpp"

namespace distlock::testing {
namespace {

using namespace std::chrono_literals;
using detail::lock_file_name;
using detail::record_file_name;
namespace fs = std::filesystem;

struct FileRecords : ::testing::Test {
  TempDir tmp{"distlock-records"};
  fs::path dir = tmp.path() / "locks";

  std::string url() const { return "file://" + dir.string() + "?recheck=5s"; }

  std::unique_ptr<Backend> backend(const ClientOptions& opts = {}) const {
    detail::Url u;
    Error ec;
    EXPECT_FALSE(ec = detail::parse_url(url(), u)) << ec.detail();
    auto b = detail::make_file_backend(u, opts, ec);
    EXPECT_TRUE(b) << ec.detail();
    return b;
  }
};

TEST_F(FileRecords, PutGetEraseAndBinaryValues) {
  auto b = backend();
  EXPECT_EQ(get(*b, "cfg"), std::nullopt);  // no record directory yet: none, no error
  Error ec;
  EXPECT_FALSE(b->erase_record("cfg", ec));
  EXPECT_FALSE(ec);

  EXPECT_EQ(put(*b, "cfg", "one", PutMode::always), "one");
  EXPECT_EQ(get(*b, "cfg"), "one");
  EXPECT_EQ(put(*b, "cfg", "two", PutMode::always), "two");  // always overwrites
  EXPECT_EQ(get(*b, "cfg"), "two");
  EXPECT_EQ(put(*b, "cfg", "three", PutMode::if_absent), "two");  // if_absent keeps and returns it
  EXPECT_EQ(get(*b, "cfg"), "two");

  const std::string bin = all_bytes();
  EXPECT_EQ(put(*b, "cfg", bin, PutMode::always), bin);
  EXPECT_EQ(get(*b, "cfg"), bin);
  EXPECT_EQ(put(*b, "empty", "", PutMode::if_absent), "");
  EXPECT_EQ(get(*b, "empty"), std::string());  // an empty value is a record, not "none"

  EXPECT_TRUE(b->erase_record("cfg", ec));
  EXPECT_FALSE(ec);
  EXPECT_FALSE(b->erase_record("cfg", ec));
  EXPECT_EQ(get(*b, "cfg"), std::nullopt);
  EXPECT_EQ(put(*b, "cfg", "after", PutMode::if_absent), "after");  // absent again after erase

  // Another client (a fresh backend) reads what this one wrote.
  auto other = backend();
  EXPECT_EQ(get(*other, "cfg"), "after");
  // Nothing is left behind but the record files.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "records")) files.push_back(e.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"cfg.rec", "empty.rec"}));
  EXPECT_EQ(fs::status(dir / "records").permissions() & fs::perms::all, fs::perms::owner_all);
}

TEST_F(FileRecords, ValueSizeBoundIs64KiB) {
  auto b = backend();
  expect_value_bound_is_64kib(*b);
}

TEST_F(FileRecords, RecordAndLockOfOneNameCoexist) {
  auto b = backend();
  Error ec;
  const AcquireRequest req{"shared-name", "owner-1", Millis(1000)};
  auto got = b->try_acquire(req, ec);
  ASSERT_FALSE(ec);
  ASSERT_TRUE(got.acquired);
  const std::string lock_bytes = read_file(dir / lock_file_name("shared-name"));

  EXPECT_EQ(put(*b, "shared-name", "value", PutMode::if_absent), "value");
  EXPECT_EQ(read_file(dir / lock_file_name("shared-name")), lock_bytes);  // the lock file is untouched
  auto st = b->status("shared-name", ec);
  EXPECT_TRUE(st.held);
  EXPECT_EQ(st.token, got.token);

  EXPECT_EQ(b->release("shared-name", "owner-1", got.token, ec), ReleaseStatus::released);
  EXPECT_EQ(get(*b, "shared-name"), "value");  // a record outlives any lock: it never expires
  EXPECT_TRUE(b->erase_record("shared-name", ec));
  auto again = b->try_acquire(req, ec);  // erasing the record left the lock's token counter alone
  ASSERT_TRUE(again.acquired);
  EXPECT_EQ(again.token, got.token + 1);
  b->release("shared-name", "owner-1", again.token, ec);
}

TEST_F(FileRecords, OddAndLongKeys) {
  auto b = backend();
  const std::vector<std::string> keys = {"a/b",
                                         "line\r\nbreak",
                                         ".hidden",
                                         "..",
                                         std::string("x\x1fsem"),
                                         std::string(4096, 'k'),
                                         std::string(300, '/')};
  for (const auto& k : keys) EXPECT_EQ(put(*b, k, "v:" + k, PutMode::always), "v:" + k);
  for (const auto& k : keys) EXPECT_EQ(get(*b, k), "v:" + k);
  for (const auto& e : fs::directory_iterator(dir / "records")) {
    const std::string f = e.path().filename();
    EXPECT_TRUE(e.is_regular_file()) << f;
    EXPECT_LE(f.size(), 255u) << f;
    EXPECT_NE(f[0], '.') << f;  // no temporary file left, nothing hidden
  }
  EXPECT_EQ(record_file_name(std::string(4096, 'k')).substr(64), ".hrec");
  EXPECT_EQ(record_file_name("a/b"), "a%2Fb.rec");
  // The lock directory itself got no lock files from records.
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "records");
}

// Two processes race put(if_absent) on one key, released together by a pipe: both get
// the same answer, the value of one of them, and that is what is stored.
TEST_F(FileRecords, IfAbsentRaceBetweenTwoProcessesAgrees) {
  const fs::path outdir = tmp.path() / "out";
  fs::create_directories(outdir);
  const fs::path probe_dir = dir;
  backend().reset();  // creates the directory; no thread is left running at fork time
  constexpr int kRounds = 25;
  for (int round = 0; round < kRounds; ++round) {
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> kids;
    for (int i = 0; i < 2; ++i) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(go[1]);
        detail::Url u;
        Error ec;
        if (detail::parse_url(url(), u)) ::_exit(2);
        auto b = detail::make_file_backend(u, {}, ec);
        if (!b) ::_exit(3);
        char c;
        (void)!::read(go[0], &c, 1);  // EOF when the parent closes its end: both start together
        const std::string mine = "proc" + std::to_string(i) + "-round" + std::to_string(round);
        const std::string got = b->put_record("race-" + std::to_string(round), mine, PutMode::if_absent, ec);
        if (ec) ::_exit(4);
        std::ofstream(outdir / (std::to_string(round) + "-" + std::to_string(i)), std::ios::binary) << got;
        ::_exit(0);
      }
      kids.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);
    for (pid_t pid : kids) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
    }
    const std::string a = read_file(outdir / (std::to_string(round) + "-0"));
    const std::string c = read_file(outdir / (std::to_string(round) + "-1"));
    EXPECT_EQ(a, c) << "round " << round;
    EXPECT_TRUE(a == "proc0-round" + std::to_string(round) || a == "proc1-round" + std::to_string(round))
        << a;
    auto b = backend();
    EXPECT_EQ(get(*b, "race-" + std::to_string(round)), a);
  }
  for (const auto& e : fs::directory_iterator(probe_dir / "records")) {
    EXPECT_NE(e.path().filename().string()[0], '.') << "temporary file left: " << e.path();
  }
}

// A writer SIGKILLed while it overwrites a record again and again leaves a whole
// value: the old one or the new one, never a mix or a cut.
TEST_F(FileRecords, RecordSurvivesWriterKilledMidWrite) {
  backend().reset();  // creates the directory; no thread is left running at fork time
  // 40 rounds, round r killed r * 97 us after the writer's fourth write was seen.
  expect_record_survives_its_writer_killed(
      url(), detail::make_file_backend, "distlock-file-writer", [] {}, 40, std::chrono::microseconds(97));
}

TEST_F(FileRecords, ListHeldPrefixLimitTruncated) {
  auto b = backend();
  Error ec;
  const std::string long_name = "job/" + std::string(300, 'z');  // a hashed lock file name
  std::vector<std::pair<std::string, std::uint64_t>> held;
  for (const std::string n : {"job/c", "job/a", "other", "job/b", long_name.c_str(), "jobs", "job/\r\n"}) {
    auto r = b->try_acquire(AcquireRequest{n, "owner-" + n.substr(0, 8), Millis(1000)}, ec);
    ASSERT_TRUE(r.acquired) << n;
    held.emplace_back(n, r.token);
  }
  ASSERT_EQ(lock_file_name(long_name).substr(64), ".hlock");
  // Released locks and records are never listed.
  auto gone = b->try_acquire(AcquireRequest{"job/released", "o", Millis(1000)}, ec);
  ASSERT_TRUE(gone.acquired);
  b->release("job/released", "o", gone.token, ec);
  put(*b, "job/record-only", "v", PutMode::always);
  // A file in the directory that is not a lock file is skipped.
  std::ofstream(dir / "notes.txt") << "hello";

  bool truncated = true;
  EXPECT_EQ(names(*b, "job/", 100, truncated),
            (std::vector<std::string>{"job/\r\n", "job/a", "job/b", "job/c", long_name}));
  EXPECT_FALSE(truncated);
  EXPECT_EQ(names(*b, "job/", 2, truncated), (std::vector<std::string>{"job/\r\n", "job/a"}));
  EXPECT_TRUE(truncated);
  EXPECT_EQ(names(*b, "job/", 5, truncated).size(), 5u);
  EXPECT_FALSE(truncated);  // exactly the limit: nothing more
  EXPECT_EQ(names(*b, "", 100, truncated),
            (std::vector<std::string>{"job/\r\n", "job/a", "job/b", "job/c", long_name, "jobs", "other"}));
  EXPECT_EQ(names(*b, "nothing", 100, truncated), std::vector<std::string>{});
  EXPECT_EQ(names(*b, "", 0, truncated), std::vector<std::string>{});
  EXPECT_TRUE(truncated);

  // Each entry says what status() says.
  auto listed = b->list_held("", 100, truncated, ec);
  ASSERT_FALSE(ec);
  for (const auto& l : listed) {
    const auto st = b->status(l.name, ec);
    EXPECT_TRUE(l.info.held);
    EXPECT_EQ(l.info.held, st.held) << l.name;
    EXPECT_EQ(l.info.token, st.token) << l.name;
    EXPECT_EQ(l.info.holder, st.holder) << l.name;
    ASSERT_TRUE(l.info.holder.has_value());
    EXPECT_NE(l.info.holder->find("(pid " + std::to_string(::getpid()) + ")"), std::string::npos);
  }
  for (const auto& [n, token] : held)
    EXPECT_TRUE(b->release(n, "owner-" + n.substr(0, 8), token, ec) == ReleaseStatus::released);
  EXPECT_EQ(names(*b, "", 100, truncated), std::vector<std::string>{});
  EXPECT_FALSE(truncated);
}

TEST_F(FileRecords, ListHeldShowsAnotherProcessAndDropsItWhenKilled) {
  auto b = backend();
  const std::string out = (tmp.path() / "holder.out").string();
  Process p = spawn_holder(url(), "svc/worker", out, 2000);
  ASSERT_TRUE(wait_for_text(out, "acquired", 30s)) << read_file(out);
  bool truncated = false;
  Error ec;
  auto listed = b->list_held("svc/", 10, truncated, ec);
  ASSERT_FALSE(ec);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name, "svc/worker");
  ASSERT_TRUE(listed[0].info.holder.has_value());
  EXPECT_NE(listed[0].info.holder->find("(pid " + std::to_string(p.pid()) + ")"), std::string::npos)
      << *listed[0].info.holder;
  EXPECT_EQ(static_cast<long long>(listed[0].info.token.value_or(0)), acquired_token(out));
  // Listing took nothing from the holder: it still holds, and a try by us is refused.
  auto busy = b->try_acquire(AcquireRequest{"svc/worker", "me", Millis(1000)}, ec);
  EXPECT_FALSE(busy.acquired);

  p.signal(SIGKILL);
  ASSERT_NE(p.wait_for(30s), -1);  // reaped: the kernel has dropped its lock
  EXPECT_EQ(names(*b, "svc/", 10, truncated), std::vector<std::string>{});
}

TEST_F(FileRecords, DamagedOrForeignRecordFilesAreProtocolErrors) {
  auto b = backend();
  put(*b, "right", "value", PutMode::always);
  fs::copy_file(dir / "records" / record_file_name("right"), dir / "records" / record_file_name("wrong"));
  Error ec;
  b->get_record("wrong", ec);
  EXPECT_EQ(ec, make_error_code(errc::protocol_error));
  EXPECT_NE(ec.take_detail().find("belongs to another key \"right\""), std::string::npos);
  b->put_record("wrong", "x", PutMode::if_absent, ec);  // if_absent reads the existing one: refused too
  EXPECT_EQ(ec, make_error_code(errc::protocol_error));

  std::ofstream(dir / "records" / record_file_name("junk"), std::ios::binary) << "not a record";
  b->get_record("junk", ec);
  EXPECT_EQ(ec, make_error_code(errc::protocol_error));
  EXPECT_NE(ec.take_detail().find("DLRECF1"), std::string::npos);
  EXPECT_EQ(read_file(dir / "records" / record_file_name("junk")), "not a record");  // kept as it was
}

// A fenced put takes the records directory's flock for its read-compare-rename. A process
// stopped while it holds that flock (SIGSTOP here; a paused or swapped-out writer alike)
// must not hang every other fenced put: the put waits at most the client's command timeout
// (300 ms here), then fails with backend_unavailable naming the directory, and writes
// nothing. Once the holder is gone the same put lands.
TEST_F(FileRecords, FencedPutGivesUpOnADirectoryLockHeldByAStoppedProcess) {
  put(*backend(), "elect", "1\none", PutMode::fenced);  // creates records/; no thread left at fork
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    const int fd = ::open((dir / "records").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(2);
    (void)!::write(ready[1], "x", 1);
    ::raise(SIGSTOP);
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  const ssize_t n = ::read(ready[0], &c, 1);  // EOF if the child exits without the flock
  ::close(ready[0]);
  auto reap = [pid] {
    ::kill(pid, SIGKILL);  // its flock goes with it
    int status = 0;
    ::waitpid(pid, &status, 0);
  };
  if (n != 1) reap();
  ASSERT_EQ(n, 1) << "the child could not flock the records directory";

  ClientOptions opts;
  opts.command_timeout = 300ms;
  auto b = backend(opts);
  // Bound of the wait for the put, on this process's steady clock: far above its 300 ms.
  constexpr auto kBound = 10s;
  const auto t0 = std::chrono::steady_clock::now();
  auto stalled = std::async(std::launch::async, [&] {
    Error ec;
    std::string got = b->put_record("elect", "2\ntwo", PutMode::fenced, ec);
    return std::pair{std::move(got), std::move(ec)};
  });
  const bool returned = stalled.wait_for(kBound) == std::future_status::ready;
  const auto waited = std::chrono::steady_clock::now() - t0;
  reap();  // a put still blocked in flock() returns now
  auto [got, ec] = stalled.get();
  ASSERT_TRUE(returned) << "the fenced put was still blocked after 10 s on the flock of a stopped process "
                           "(its command timeout is 300 ms)";
  EXPECT_EQ(ec, make_error_code(errc::backend_unavailable));
  const std::string detail = ec.take_detail();
  EXPECT_NE(detail.find((dir / "records").string()), std::string::npos) << detail;
  EXPECT_NE(detail.find("300 ms"), std::string::npos) << detail;
  EXPECT_GE(waited, 300ms);
  EXPECT_EQ(get(*b, "elect"), "1\none");  // nothing written
  EXPECT_EQ(put(*b, "elect", "2\ntwo", PutMode::fenced), "2\ntwo");
  for (const auto& e : fs::directory_iterator(dir / "records")) {
    EXPECT_NE(e.path().filename().string()[0], '.') << "temporary file left: " << e.path();
  }
}

TEST_F(FileRecords, RecordDirectoryOthersCanWriteIsRefused) {
  auto b = backend();
  put(*b, "k", "v", PutMode::always);
  fs::permissions(dir / "records", fs::perms::group_write, fs::perm_options::add);
  Error ec;
  b->get_record("k", ec);
  EXPECT_EQ(ec, make_error_code(errc::backend_unavailable));
  EXPECT_NE(ec.take_detail().find("writable by its group"), std::string::npos);
  b->put_record("k", "w", PutMode::always, ec);
  EXPECT_EQ(ec, make_error_code(errc::backend_unavailable));
}

TEST(FileRecordNames, LockFileNamesDecode) {
  using detail::lock_name_of_file;
  for (const std::string n : {"a", "orders/42", "..", ".x", "line\r\n", "caf\xc3\xa9", "%41", "x.lock"}) {
    EXPECT_EQ(lock_name_of_file(lock_file_name(n)), n) << n;
  }
  EXPECT_EQ(lock_name_of_file("a%41.lock"), std::nullopt);  // not canonical: lock_file_name("aA") is aA.lock
  EXPECT_EQ(lock_name_of_file("%2.lock"), std::nullopt);
  EXPECT_EQ(lock_name_of_file("%zz.lock"), std::nullopt);
  EXPECT_EQ(lock_name_of_file(".lock"), std::nullopt);
  EXPECT_EQ(lock_name_of_file("a.hlock"), std::nullopt);
  EXPECT_EQ(lock_name_of_file("notes.txt"), std::nullopt);
  EXPECT_EQ(lock_name_of_file(lock_file_name(std::string(300, 'q'))), std::nullopt);  // hashed
}

}  // namespace
}  // namespace distlock::testing
