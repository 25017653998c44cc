// memory://NAME — an in-process backend for tests and examples. Every client
// connected to the same NAME in one process shares one store, so several clients
// can contend. Leases expire by the client's injected clock. The store can inject
// faults (fail the next calls, steal or expire a lock) and counts calls, so the
// engine can be tested without servers.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/backend.hpp"

namespace distlock::detail {

class MemoryStore {
 public:
  struct Entry {
    std::string owner;
    Clock::time_point expires{};
    std::uint64_t token = 0;
  };

  /// The shared store for memory://name (created on first use).
  static std::shared_ptr<MemoryStore> named(const std::string& name);

  // Fault injection.
  void fail_next(int calls, errc code = errc::backend_unavailable);
  void steal(const std::string& lock, const std::string& new_owner);
  void drop(const std::string& lock);  ///< deletes the lock silently (no notification)
  void set_fencing(bool on) { fencing_ = on; }
  void set_needs_renewal(bool on) { needs_renewal_ = on; }
  /// What every backend of this store reports as notification_channel_drops().
  void set_notification_channel_drops(std::uint64_t n) { channel_drops_ = n; }
  /// Makes every renew() call block this long first (a hung server), in real time.
  void set_renew_delay(std::chrono::milliseconds d) { renew_delay_ms_ = d.count(); }
  /// Grants at most `v` of validity per acquire/renew (0: the requested TTL), like a
  /// ZooKeeper session shorter than the TTL.
  void set_max_validity(std::chrono::milliseconds v) { max_validity_ms_ = v.count(); }
  /// Makes the next `calls` watch() calls fail with `code` (a subscriber that cannot connect).
  void fail_next_watches(int calls, errc code = errc::backend_unavailable);
  /// Makes `calls` try_acquire() calls, after the next `after` ones, throw
  /// std::runtime_error (a backend bug).
  void throw_next_acquires(int calls, int after = 0);

  // Observation.
  int try_acquire_calls() const;
  int renew_calls() const;
  int release_calls() const;
  std::size_t last_renew_batch() const;
  bool held(const std::string& lock, Clock::time_point now) const;
  std::string holder(const std::string& lock) const;
  /// Names watched right now, over every client of this store (watch minus unwatch).
  int live_watches() const;
  int cancel_calls() const;

 private:
  friend class MemoryBackend;
  bool take_failure(Error& ec);

  mutable std::mutex mu_;
  std::map<std::string, Entry> locks_;
  std::map<std::string, std::uint64_t> fences_;
  std::map<std::string, std::string> records_;
  std::map<std::string, int> watchers_;
  std::vector<class MemoryBackend*> backends_;
  int fail_calls_ = 0;
  errc fail_code_ = errc::backend_unavailable;
  int n_try_ = 0, n_renew_ = 0, n_release_ = 0, n_cancel_ = 0, live_watches_ = 0;
  int fail_watches_ = 0, throw_acquires_ = 0, throw_after_ = 0;
  errc fail_watch_code_ = errc::backend_unavailable;
  std::size_t last_batch_ = 0;
  bool fencing_ = true;
  bool needs_renewal_ = true;
  std::atomic<long> renew_delay_ms_{0};
  std::atomic<long> max_validity_ms_{0};
  std::atomic<std::uint64_t> channel_drops_{0};
};

std::unique_ptr<Backend> make_memory_backend(const Url& url, const ClientOptions& opts, Error& err);

}  // namespace distlock::detail
