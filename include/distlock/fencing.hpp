// distlock/fencing.hpp — fenced writes: let the protected resource reject a stale lock holder.
//
// Why this exists. A lease-based lock cannot by itself guarantee mutual exclusion of
// the *effects* of its holders. A holder can be paused for longer than its lease
// (a stop-the-world GC, a SIGSTOP, a swapped-out page, a VM migration, a long
// network delay of a request already sent). While it is paused the lease expires,
// another client acquires the lock and writes; then the first one wakes up, still
// believing it holds the lock, and writes too — a lost update. Checking `owns()`
// right before the write does not help: the pause can fall between the check and
// the write, or the write can sit in a socket buffer. (Martin Kleppmann, "How to do
// distributed locking", 2016.)
//
// The fix is a *fencing token*: every acquisition gets a number strictly larger
// than every earlier one for that lock name (`Lease::token()`), the holder sends it
// with each write, and **the resource itself** refuses a write whose token is
// smaller than the largest it has already seen. The check must run where the data
// lives, atomically with the write — a client-side check has the same race as
// `owns()`. This header gives that check for three kinds of resource:
//
//   RedisFence  — a resource stored in Redis: each write runs in one Lua script that
//                 compares the token with the resource's fence key, records it and
//                 applies the write, or applies nothing and reports `stale`.
//   FileFence   — a resource stored in local files: the fence is a small file whose
//                 kernel lock (OFD, falling back to flock) is held while the token is
//                 checked, recorded and the caller's write runs.
//   FenceGuard  — a resource in this process's memory: an atomic maximum.
//
// A stale token is a normal, expected outcome, reported as `FenceStatus::stale`
// (never applied, nothing written); `FenceResult::check()` turns it into a
// `std::system_error` with `errc::lost`. I/O failures are `errc::backend_unavailable`,
// a script error `errc::protocol_error`, bad arguments `errc::invalid_argument`.
//
// The fence of a Redis key K lives at `fence_key_for(K)` = K + ":distlock-fence" and
// never expires. For a later Redis Cluster, give K a hash tag ("{sale}:stock") so the
// fence lands in K's slot. Tokens are compared exactly as unsigned 64-bit decimals.
//
// Thread-safety: `RedisFence` and `FileFence` may be shared by threads (RedisFence
// keeps a small pool of connections; FileFence opens its own file description per
// call, so threads exclude each other through the kernel lock). `FenceGuard` is
// lock-free for `admit` and serialises `apply`.
//
// Example (the seckill example does this for every purchase):
//   distlock::Client locks = distlock::connect("redis://127.0.0.1:6379");
//   distlock::RedisFence store("redis://127.0.0.1:6379");
//   distlock::Lease lease = locks.acquire("sale/42");
//   auto r = store.decrement_if_positive("sale:42:stock", lease.token());
//   if (r.status == distlock::FenceStatus::stale) { /* we lost the lock; nothing written */ }
//   else if (r.decremented) { /* sold one; r.value is the stock left */ }
#pragma once

#include "distlock/config.hpp"
#include "distlock/export.hpp"

// Installed with the other headers whether or not this build has the component; without it
// the declarations below would compile and then fail to link, so say so here instead.
#if !DISTLOCK_HAS_FENCING
#error "distlock was built without the fencing component (DISTLOCK_WITH_FENCING=OFF)"
#endif

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "distlock/error.hpp"
#include "distlock/options.hpp"

namespace distlock {

/// Whether a fenced write was applied.
enum class FenceStatus {
  applied,  ///< the token was >= every token seen before; it is recorded and the write ran
  stale,    ///< a larger token was seen before; nothing was written
};

/// The outcome of one fenced write.
struct DISTLOCK_EXPORT FenceResult {
  FenceStatus status = FenceStatus::stale;
  /// The highest token the resource has seen, after this call (equals the caller's
  /// token when applied; the newer holder's token when stale).
  std::uint64_t highest_token = 0;

  bool applied() const noexcept { return status == FenceStatus::applied; }
  explicit operator bool() const noexcept { return applied(); }
  /// Throws `std::system_error(errc::lost)` when stale (naming the tokens).
  void check(std::uint64_t my_token) const;
};

/// `decrement_if_positive`: applied or stale, and whether the value was positive.
struct DISTLOCK_EXPORT DecrementResult : FenceResult {
  bool decremented = false;  ///< false when applied but the value was <= 0 (or missing)
  std::int64_t value = 0;    ///< the value after the call (unchanged if not decremented)
};

/// A Redis reply, as returned by a fenced script body (`RedisFence::eval`).
struct DISTLOCK_EXPORT RedisValue {
  enum class Type { nil, integer, string, status, array };
  Type type = Type::nil;
  long long integer = 0;
  std::string str;  ///< for string and status
  std::vector<RedisValue> elements;
};

/// `RedisFence::eval`: applied or stale, and what the body returned when applied.
struct DISTLOCK_EXPORT ScriptResult : FenceResult {
  RedisValue reply;
};

/// The Redis key holding the fence of `key`: key + ":distlock-fence".
DISTLOCK_EXPORT std::string fence_key_for(std::string_view key);

/// Fenced writes to a resource stored in Redis. Every write is one EVALSHA of a
/// script that compares the token with the key's fence, records it, and writes,
/// atomically on the server.
class DISTLOCK_EXPORT RedisFence {
 public:
  /// `url` is a redis:// URL as for `connect()` (user, password, db, ?timeout=).
  /// Connects lazily; throws errc::invalid_url for a malformed or non-redis URL.
  explicit RedisFence(std::string_view url, const ClientOptions& opts = {});
  ~RedisFence();
  RedisFence(RedisFence&&) noexcept;
  RedisFence& operator=(RedisFence&&) noexcept;
  RedisFence(const RedisFence&) = delete;
  RedisFence& operator=(const RedisFence&) = delete;

  /// SET key value, if `token` passes the fence.
  FenceResult set(std::string_view key, std::string_view value, std::uint64_t token);
  FenceResult set(std::string_view key, std::string_view value, std::uint64_t token,
                  std::error_code& ec) noexcept;

  /// HSET key field value, if `token` passes the fence of `key`.
  FenceResult hset(std::string_view key, std::string_view field, std::string_view value, std::uint64_t token);
  FenceResult hset(std::string_view key, std::string_view field, std::string_view value, std::uint64_t token,
                   std::error_code& ec) noexcept;

  /// DECR key if its integer value is > 0, if `token` passes the fence. A missing
  /// key counts as 0; a non-integer value is errc::protocol_error.
  DecrementResult decrement_if_positive(std::string_view key, std::uint64_t token);
  DecrementResult decrement_if_positive(std::string_view key, std::uint64_t token,
                                        std::error_code& ec) noexcept;

  /// The escape hatch: runs the Lua `body` (a script as for EVAL, using KEYS and
  /// ARGV and returning a value) only if `token` passes the fence of keys[0]; the
  /// check, the record and the body run in one script. `keys` must not be empty;
  /// every key the body touches must be in `keys`.
  ///
  ///   store.eval("redis.call('RPUSH', KEYS[1], ARGV[1]) return redis.call('LLEN', KEYS[1])",
  ///              {"sale:42:buyers"}, {"alice"}, lease.token());
  ScriptResult eval(std::string_view body, const std::vector<std::string>& keys,
                    const std::vector<std::string>& args, std::uint64_t token);
  ScriptResult eval(std::string_view body, const std::vector<std::string>& keys,
                    const std::vector<std::string>& args, std::uint64_t token, std::error_code& ec) noexcept;

  /// The highest token recorded for `key` (0 if none). Unfenced read.
  std::uint64_t highest_token(std::string_view key);
  /// GET key (unfenced read; nullopt when missing).
  std::optional<std::string> get(std::string_view key);
  /// Unfenced reset of a resource: DEL key and its fence. For setting up a resource
  /// while nobody holds its lock (tests, example start-up) — never while a stale
  /// holder might still write.
  void reset(std::string_view key);

  /// Any command (argv form, binary-safe) on a pooled connection, for set-up and
  /// inspection. Not fenced.
  RedisValue command(const std::vector<std::string>& argv);

  /// The URL with the password masked.
  std::string url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Fenced writes to a resource stored in local files (one host). The fence is the
/// file `fence_file`; each `apply` opens it, takes its kernel lock (OFD lock, or
/// flock where OFD locks are missing), compares and records the token, runs the
/// caller's write, and unlocks. Every writer of the resource must go through the
/// same fence file.
class DISTLOCK_EXPORT FileFence {
 public:
  /// The fence file is created (mode 0600) on first use; its directory must exist. It
  /// must be a regular file owned by the caller or root and is never reached through a
  /// symbolic link; otherwise apply() and highest_token() throw backend_unavailable
  /// naming the file and the problem.
  explicit FileFence(std::filesystem::path fence_file);

  /// Runs `write` if `token` passes the fence (the lock is held while it runs; an
  /// exception from `write` propagates after the lock is dropped — the token stays
  /// recorded). Throws errc::backend_unavailable naming the file on I/O errors.
  FenceResult apply(std::uint64_t token, const std::function<void()>& write);
  FenceResult apply(std::uint64_t token, const std::function<void()>& write, std::error_code& ec) noexcept;

  /// The highest token recorded (0 if the file does not exist).
  std::uint64_t highest_token() const;
  /// Removes the fence file (set-up only; see RedisFence::reset).
  void reset();

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

/// The in-process fence for a resource in this process's memory.
///
///   distlock::FenceGuard fence;
///   fence.apply(lease.token(), [&] { cache[key] = value; });
class DISTLOCK_EXPORT FenceGuard {
 public:
  /// Records `token` if it is >= the highest seen (an atomic maximum); true if it
  /// passed. Only a check: when the write that follows must not interleave with a
  /// newer holder's write, use `apply`.
  bool admit(std::uint64_t token) noexcept;

  /// Checks, records and runs `write` under one mutex, so a stale holder's write can
  /// never land after a newer holder's.
  template <class F>
  FenceResult apply(std::uint64_t token, F&& write) {
    std::lock_guard lk(mu_);
    if (!admit(token)) return {FenceStatus::stale, highest()};
    std::forward<F>(write)();
    return {FenceStatus::applied, highest()};
  }

  std::uint64_t highest() const noexcept { return highest_.load(std::memory_order_acquire); }

 private:
  std::atomic<std::uint64_t> highest_{0};
  std::mutex mu_;
};

}  // namespace distlock
