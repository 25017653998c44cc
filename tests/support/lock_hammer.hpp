// Lock hammers of the adversarial reviews (tests/redis/handoff_faults_test.cpp,
// shared_connection_faults_test.cpp, acquire_fastpath_test.cpp): several clients of one server,
// several threads per client (each with a generator seeded from its client and thread), a run of
// a fixed length, and the record of who is inside each name's critical section, which counts
// overlaps and token regressions.
//
// Thread-safety: NameSections may be used from any thread; the free functions are for the test's
// main thread (the bodies they start run on the threads they make).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "distlock/distlock.hpp"
#include "engine/thread_annotations.hpp"

namespace distlock::testing {

/// `n` clients of `url`, connected with `options`.
inline std::vector<Client> connect_clients(const std::string& url, int n, const ClientOptions& options = {}) {
  std::vector<Client> clients;
  for (int i = 0; i < n; ++i) clients.push_back(connect(url, options));
  return clients;
}

/// Starts `per_client` threads for each of `clients` clients: thread t of client c runs
/// `body(c, rng)` with `rng` seeded c * `seed_step` + t (each run of a test draws the same).
template <class Body>
std::vector<std::thread> start_hammer_threads(int clients, int per_client, unsigned seed_step, Body body) {
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    for (int t = 0; t < per_client; ++t) {
      threads.emplace_back([body, c, t, seed_step] {
        std::minstd_rand rng(static_cast<unsigned>(c) * seed_step + static_cast<unsigned>(t));
        body(c, rng);
      });
    }
  }
  return threads;
}

/// Lets `threads` run for `length` (the test's duration, not a synchronisation), then sets `stop`
/// and joins them. Each thread ends once it sees `stop` (bodies bound their loops by count too).
inline void run_hammer_for(std::chrono::milliseconds length, std::atomic<bool>& stop,
                           std::vector<std::thread>& threads) {
  std::this_thread::sleep_for(length);
  stop = true;
  for (auto& t : threads) t.join();
}

/// Who is inside the critical section of each of `names` names (numbered from 0).
class NameSections {
 public:
  explicit NameSections(int names)
      : inside_(static_cast<std::size_t>(names)), last_token_(inside_.size(), 0) {}

  /// `lease` enters the section of name `k`. An overlap is counted for each lease inside that
  /// still owns() (with `only_while_owned`: only while `lease` owns() too); a token not above the
  /// last one entered for `k` is a regression (with `only_while_owned`: recorded only if `lease`
  /// owns(), since one that lost its lease before this line is no longer a holder).
  void enter(int k, const Lease& lease, bool only_while_owned = false) {
    detail::LockGuard lk(mu_);
    const bool owned = !only_while_owned || lease.owns();
    for (const Lease* other : inside_[k]) {
      if (other->owns() && (!only_while_owned || lease.owns())) ++overlaps_;
    }
    if (owned) {
      if (lease.token() <= last_token_[k]) ++regressions_;
      last_token_[k] = std::max(last_token_[k], lease.token());
    }
    inside_[k].push_back(&lease);
  }

  /// `lease` leaves the section of name `k` (before it is released).
  void leave(int k, const Lease& lease) {
    detail::LockGuard lk(mu_);
    auto& v = inside_[k];
    v.erase(std::remove(v.begin(), v.end(), &lease), v.end());
  }

  int overlaps() {
    detail::LockGuard lk(mu_);
    return overlaps_;
  }
  int regressions() {
    detail::LockGuard lk(mu_);
    return regressions_;
  }

 private:
  detail::AnnotatedMutex mu_;
  std::vector<std::vector<const Lease*>> inside_ DISTLOCK_GUARDED_BY(mu_);
  std::vector<std::uint64_t> last_token_ DISTLOCK_GUARDED_BY(mu_);
  int overlaps_ DISTLOCK_GUARDED_BY(mu_) = 0;
  int regressions_ DISTLOCK_GUARDED_BY(mu_) = 0;
};

}  // namespace distlock::testing
