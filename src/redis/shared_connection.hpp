// redis/shared_connection.hpp — one connection to one server shared by every
// thread of a client, with auto-pipelining (as ioredis's autoPipelining and
// Lettuce do): calls from many threads go out on the same socket without waiting
// for each other's replies, and the replies are matched to the calls in order.
//
// Why: a thread pool locking per-order or per-user names would otherwise need a
// connection per thread and a round trip per call that nothing overlaps. Here 16
// threads keep 16 calls in flight on one socket; the server reads them together
// and one reader hands every thread its reply.
//
// How, without a thread of its own: a caller appends its formatted commands to the
// output buffer; if nobody is writing it writes the buffer (everything queued so
// far, other threads' commands included). It then waits for its replies; if nobody
// is reading, it reads for everybody, hands each completed call its replies (and
// wakes that caller), and gives the reading role to the oldest waiting call when
// its own call is complete. At most one thread writes and one reads at a time. A
// caller that has just written waits for the socket to be readable before its first
// read (its reply cannot be there sooner than a round trip): a read that would find
// nothing is not made.
//
// Connecting: one caller connects (outside the lock); callers arriving meanwhile
// wait for that attempt and share its outcome.
//
// Failures: a call whose replies have not all arrived within the command timeout,
// an I/O error, EOF or a stray reply breaks the connection: every call in flight on
// it fails with backend_unavailable and a message naming the server; the next call
// connects again (AUTH, SELECT). A connection the server closed while idle is
// noticed before it is used (as ConnectionPool does), so the first call after a
// server restart goes out on a fresh one. Outcome of a call that failed this way is
// unknown (the server may have run it), exactly as with a timed-out `Connection`.
//
// Not for: blocking commands (WAIT, BLPOP, SUBSCRIBE) and MULTI/EXEC, which would
// stall or interleave with other threads' calls: use a pooled `Connection`.
//
// Thread-safety: every member is safe to call from any number of threads.
//
// Example:
//   SharedConnection shared(opts);                         // one per client and server
//   std::error_code ec;
//   Reply r = shared.command({"GET", key}, ec);            // from any thread
//   Reply n = script.run(shared, {key}, {owner, ttl}, ec); // Script takes any Link
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "engine/thread_annotations.hpp"
#include "redis/connection.hpp"

namespace distlock::detail::redis {

class SharedConnection final : public Link {
 public:
  explicit SharedConnection(ConnectionOptions opts);
  SharedConnection(const SharedConnection&) = delete;
  SharedConnection& operator=(const SharedConnection&) = delete;
  /// No call may be in flight (the owner destroys it after its last call returned).
  ~SharedConnection() override;

  Reply command(std::span<const std::string_view> argv, Error& ec) override;
  using Link::command;
  std::vector<Reply> exchange(std::span<const Argv> batch, Error& ec) override;
  bool connected() const noexcept override;
  const ConnectionOptions& options() const noexcept { return opts_; }

  /// Counters for tests and benchmarks.
  struct Stats {
    std::uint64_t calls = 0;     ///< exchange() and command() calls that sent something
    std::uint64_t writes = 0;    ///< socket writes (one carries the commands of many calls)
    std::uint64_t connects = 0;  ///< connections opened
    std::size_t in_flight = 0;   ///< calls queued on the current connection, awaiting replies
  };
  Stats stats() const noexcept;

 private:
  struct Pending;
  struct Wire;
  // These three take the caller's lock on mu_ and drop it around socket I/O, which the
  // analysis cannot follow through a lock passed by reference: callers are checked to hold
  // mu_, the bodies are not.
  std::shared_ptr<Wire> wire_for_call(UniqueLock& lk, Error& ec)
      DISTLOCK_REQUIRES(mu_) DISTLOCK_NO_THREAD_SAFETY_ANALYSIS;
  void write_out(UniqueLock& lk, const std::shared_ptr<Wire>& w)
      DISTLOCK_REQUIRES(mu_) DISTLOCK_NO_THREAD_SAFETY_ANALYSIS;
  void read_for(UniqueLock& lk, const std::shared_ptr<Wire>& w, Pending& mine, bool just_wrote)
      DISTLOCK_REQUIRES(mu_) DISTLOCK_NO_THREAD_SAFETY_ANALYSIS;
  void fail(const std::shared_ptr<Wire>& w, const Error& err) DISTLOCK_REQUIRES(mu_);
  std::vector<Reply> send(const std::string& cmds, std::size_t n, Error& ec) DISTLOCK_EXCLUDES(mu_);
  /// As send(), the replies put in `into` (its earlier contents dropped, its capacity kept).
  void send_into(const std::string& cmds, std::size_t n, std::vector<Reply>& into, Error& ec)
      DISTLOCK_EXCLUDES(mu_);

  const ConnectionOptions opts_;
  mutable AnnotatedMutex mu_;
  std::shared_ptr<Wire> wire_ DISTLOCK_GUARDED_BY(mu_);  // null until the first call or after a failure
  bool connecting_ DISTLOCK_GUARDED_BY(mu_) = false;     // a caller is opening a connection (unlocked)
  std::uint64_t connect_attempts_ DISTLOCK_GUARDED_BY(mu_) = 0;  // finished attempts
  Error connect_ec_ DISTLOCK_GUARDED_BY(mu_);                    // the outcome of the last attempt
  std::condition_variable connected_cv_;                         // an attempt finished
  std::atomic<std::uint64_t> calls_{0}, writes_{0}, connects_{0};
};

}  // namespace distlock::detail::redis
