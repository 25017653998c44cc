// An election's value is written only by the leader of the newest term, over every backend
// the build has (distlock/election.hpp, PutMode::fenced in engine/backend.hpp).
//
// The stale writer is in-process and deterministic: client A's backend is the real one
// behind a wrapper that holds A's next write of the election record until the test lets it
// go. While it is held, the test releases A's lease on the server itself (the inner
// backend's owner-checked release: what a lease that lapsed while its holder was starved
// looks like to the server), client B campaigns and wins a newer term and writes its value;
// then A's write goes through.
//   - CampaignWriteOfAnOlderTermIsRefused: A's campaign() is the stale writer (the window
//     between winning and writing); it must fail with errc::lost and leave B's value.
//   - ProclaimOfAnOlderTermIsRefused: A's proclaim() passed its local owns() check and is
//     the stale writer; it must fail with errc::not_owner naming B's term and leave B's value.
//   - FencedPutKeepsTheNewestTerm: the backend's PutMode::fenced itself (terms compared as
//     numbers, equal terms and records without a term replaced, 2^64 - 1 handled).
// Both election cases check what observers read: leader() names B's term with B's value
// (value_known). Before the fence, A's late write replaced it and value_known was false.
// redlock:// has no terms (every term is 0): there the stale write lands, as the header
// says; the case checks exactly that, and the fenced put's comparison is checked directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/client_access.hpp"
#include "connect/registry.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/names.hpp"
#include "engine/url.hpp"
#include "support/backend_targets.hpp"
#include "support/forwarding_backend.hpp"

namespace distlock::testing {

using namespace std::chrono_literals;

namespace {

// Bound of every wait below (measured on the steady clock of this process): far above the
// few round trips each step takes, so only a defect reaches it.
constexpr auto kStepBound = 30s;

std::unique_ptr<detail::Backend> open_backend(const std::string& url, const ClientOptions& opts) {
  detail::Url u;
  if (const detail::Error err = detail::parse_url(url, u)) throw std::system_error(err, err.detail());
  auto factory = detail::find_backend(u.scheme);
  if (factory == nullptr) throw std::runtime_error("no backend for scheme " + u.scheme);
  detail::Error ec;
  auto b = factory(u, opts, ec);
  if (!b) throw std::system_error(ec, ec.detail());
  return b;
}

// The real backend, with A's next write of one record held until go(), and A's lease of that
// name remembered so the test can end it on the server.
class HeldRecordWrite final : public ForwardingBackend {
 public:
  HeldRecordWrite(std::unique_ptr<detail::Backend> inner, std::string name)
      : ForwardingBackend(std::move(inner)), name_(std::move(name)) {}

  detail::AcquireResult try_acquire(const detail::AcquireRequest& req, detail::Error& ec) override {
    auto r = ForwardingBackend::try_acquire(req, ec);
    if (!ec && r.acquired && req.name == name_) {
      std::lock_guard lk(mu_);
      owner_ = std::string(req.owner);
      token_ = r.token;
    }
    return r;
  }
  std::string put_record(std::string_view key, std::string_view value, detail::PutMode mode,
                         detail::Error& ec) override {
    {
      std::unique_lock lk(mu_);
      if (armed_ && key == name_) {
        armed_ = false;
        reached_ = true;
        cv_.notify_all();
        cv_.wait_for(lk, kStepBound, [&] { return go_; });
      }
    }
    return ForwardingBackend::put_record(key, value, mode, ec);
  }

  void arm() {
    std::lock_guard lk(mu_);
    armed_ = true;
    reached_ = go_ = false;
  }
  bool wait_reached() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, kStepBound, [&] { return reached_; });
  }
  void go() {
    std::lock_guard lk(mu_);
    go_ = true;
    cv_.notify_all();
  }
  std::uint64_t token() {
    std::lock_guard lk(mu_);
    return token_;
  }
  // Ends A's lease on the server, owner-checked, behind A's engine's back.
  detail::ReleaseStatus end_lease_on_server() {
    std::string owner;
    std::uint64_t token = 0;
    {
      std::lock_guard lk(mu_);
      owner = owner_;
      token = token_;
    }
    detail::Error ec;
    const auto st = ForwardingBackend::release(name_, owner, token, ec);
    if (ec) throw std::system_error(ec, ec.detail());
    return st;
  }

 private:
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, reached_ = false, go_ = false;
  std::string owner_;
  std::uint64_t token_ = 0;
};

class ElectionFence : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    target_ = GetParam().make({});
    url_ = target_->url();
    opts_.ttl = Millis(std::min<std::int64_t>(4000, target_->max_ttl_ms()));
    opts_.wait = std::chrono::duration_cast<Millis>(kStepBound);
  }
  // Client A: the real backend behind HeldRecordWrite for election `name`'s lock.
  Client client_a(const std::string& name, HeldRecordWrite** held) {
    const ClientOptions co;
    auto wrapped = std::make_unique<HeldRecordWrite>(open_backend(url_, co), detail::names::election(name));
    *held = wrapped.get();
    return connect_with_engine(detail::Engine::create(std::move(wrapped), co));
  }
  // The leader as observers read it, checked to be B's (term and value).
  void expect_leader_is(Client& c, const std::string& name, std::uint64_t term, const std::string& value) {
    const auto l = c.election(name, opts_).leader();
    ASSERT_TRUE(l.has_value()) << "no leader read";
    EXPECT_EQ(l->term, term);
    EXPECT_TRUE(l->value_known) << "the newer leader's value is unknown: an older term's write replaced it";
    EXPECT_EQ(l->value, value);
  }

  std::unique_ptr<Target> target_;
  std::string url_;
  LockOptions opts_;
};

std::uint64_t term_of(const Lease& l) {
  return l.has_token() ? l.token() : 0;
}

TEST_P(ElectionFence, CampaignWriteOfAnOlderTermIsRefused) {
  const std::string name = "fence-campaign";
  HeldRecordWrite* held = nullptr;
  Client a = client_a(name, &held);
  Client b = distlock::connect(url_);
  held->arm();
  auto stale = std::async(std::launch::async, [&] {
    std::error_code ec;
    Lease l = a.election(name, opts_).campaign("old", ec);
    return std::pair{std::move(l), ec};
  });
  ASSERT_TRUE(held->wait_reached()) << "A's campaign never came to write its value";
  ASSERT_EQ(held->end_lease_on_server(), detail::ReleaseStatus::released);
  Lease newer = b.election(name, opts_).campaign("new");
  held->go();
  ASSERT_EQ(stale.wait_for(kStepBound), std::future_status::ready);
  auto [old_lease, ec] = stale.get();

  if (!target_->fencing()) {
    // No terms: both are term 0, and the later write lands (no fence without terms).
    EXPECT_FALSE(ec) << ec.message();
    detail::Error rec_ec;
    const auto rec = detail::engine_of(b)->backend().get_record(detail::names::election(name), rec_ec);
    ASSERT_FALSE(rec_ec) << rec_ec.detail();
    EXPECT_EQ(rec, std::optional<std::string>("0\nold"));
  } else {
    EXPECT_EQ(ec, distlock::errc::lost)
        << "an older term's campaign write must be refused, got: " << ec.message();
    EXPECT_FALSE(old_lease.owns());
    EXPECT_GT(newer.token(), held->token());
    expect_leader_is(b, name, newer.token(), "new");
  }
  b.election(name, opts_).resign(newer);
}

TEST_P(ElectionFence, ProclaimOfAnOlderTermIsRefused) {
  const std::string name = "fence-proclaim";
  HeldRecordWrite* held = nullptr;
  Client a = client_a(name, &held);
  Client b = distlock::connect(url_);
  Lease old_lease = a.election(name, opts_).campaign("a1");
  ASSERT_TRUE(old_lease.owns());
  held->arm();
  auto stale = std::async(std::launch::async, [&] {
    try {
      a.election(name, opts_).proclaim(old_lease, "stale");
      return std::pair{std::error_code(), std::string()};
    } catch (const std::system_error& e) {
      return std::pair{e.code(), std::string(e.what())};
    }
  });
  ASSERT_TRUE(held->wait_reached()) << "A's proclaim never came to write its value";
  ASSERT_EQ(held->end_lease_on_server(), detail::ReleaseStatus::released);
  Lease newer = b.election(name, opts_).campaign("new");
  held->go();
  ASSERT_EQ(stale.wait_for(kStepBound), std::future_status::ready);
  const auto [ec, what] = stale.get();

  if (!target_->fencing()) {
    EXPECT_FALSE(ec) << what;
    detail::Error rec_ec;
    const auto rec = detail::engine_of(b)->backend().get_record(detail::names::election(name), rec_ec);
    ASSERT_FALSE(rec_ec) << rec_ec.detail();
    EXPECT_EQ(rec, std::optional<std::string>("0\nstale"));
  } else {
    EXPECT_EQ(ec, distlock::errc::not_owner) << "an older term's proclaim must be refused, got: " << what;
    EXPECT_NE(what.find("term " + std::to_string(newer.token())), std::string::npos)
        << "the error names the newer term: " << what;
    EXPECT_GT(newer.token(), term_of(old_lease));
    expect_leader_is(b, name, newer.token(), "new");
  }
  b.election(name, opts_).resign(newer);
  std::error_code ignored;
  old_lease.release(ignored);  // lost: the server no longer has it
}

TEST_P(ElectionFence, FencedPutKeepsTheNewestTerm) {
  auto be = open_backend(url_, ClientOptions{});
  const std::string key = "fence-put\x1frecord";
  using detail::PutMode;
  detail::Error ec;
  auto put = [&](std::string_view v) {
    std::string got = be->put_record(key, v, PutMode::fenced, ec);
    EXPECT_FALSE(ec) << ec.detail();
    return got;
  };
  EXPECT_EQ(put("5\nfive"), "5\nfive");              // absent: created
  EXPECT_EQ(put("3\nthree"), "5\nfive");             // older: refused, the newer answered
  EXPECT_EQ(put("5\nfive again"), "5\nfive again");  // the same term: replaced
  EXPECT_EQ(put("12\ntwelve"), "12\ntwelve");        // compared as numbers, not as text
  EXPECT_EQ(put("9\nnine"), "12\ntwelve");
  EXPECT_EQ(put("18446744073709551615\nmax"), "18446744073709551615\nmax");
  EXPECT_EQ(put("18446744073709551614\nbelow"), "18446744073709551615\nmax");
  EXPECT_EQ(be->put_record(key, "no term", PutMode::always, ec), "no term");
  EXPECT_EQ(put("1\none"), "1\none");                            // a record without a term is replaced
  EXPECT_EQ(put("0001\nleading zeros"), "0001\nleading zeros");  // term 1 again
  EXPECT_EQ(put("0\nzero"), "0001\nleading zeros");
  EXPECT_TRUE(be->erase_record(key, ec)) << ec.detail();
}

// One leader proclaiming from 8 threads at once (Election may be used from any thread): every
// proclaim lands or is overtaken by a concurrent one of the same term; none fails. Before,
// the compare-and-set loop counted a race lost to the same leader's own write as a round
// used, and on zk1 31 of the 200 proclaims failed with "kept changing during 16 rounds".
TEST_P(ElectionFence, ConcurrentProclaimsOfOneLeaderAllLand) {
  const std::string name = "fence-contention";
  Client c = distlock::connect(url_);
  Lease lead = c.election(name, opts_).campaign("v0");
  constexpr int kThreads = 8, kEach = 25;
  std::atomic<int> failed{0};
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        try {
          c.election(name, opts_).proclaim(lead, "t" + std::to_string(t) + "-" + std::to_string(i));
        } catch (const std::system_error& e) {
          ++failed;
          std::lock_guard lk(mu);
          if (first_error.empty()) first_error = e.what();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed.load(), 0) << "of " << kThreads * kEach << " proclaims; the first: " << first_error;
  if (target_->fencing()) {
    const auto l = c.election(name, opts_).leader();
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->term, lead.token());
    EXPECT_TRUE(l->value_known);
    EXPECT_EQ(l->value.substr(l->value.size() - 3), "-24") << l->value;  // some thread's last
  }
  c.election(name, opts_).resign(lead);
}

// fenced_put_by_cas without a server: every replace is beaten by another put of the same term
// (a record that changes between each read and each compare-and-set). The call ends at the
// first race, counting itself as the earlier write; before, it failed after 16 rounds.
// A race lost to a newer term is a refusal answering that record; to an older one, a retry.
TEST(FencedPutByCas, ARaceLostToTheSameTermEndsTheCall) {
  std::string record = "7\nfirst";
  int gets = 0, replaces = 0, n = 0;
  const auto get = [&](detail::Error&) {
    ++gets;
    return std::optional<std::string>(record);
  };
  const auto create = [&](detail::Error&) { return record; };
  std::string beaten_by = "7\nsame term";
  const auto replace = [&](std::string_view expected, detail::Error&) {
    ++replaces;
    if (record != expected) return false;
    record = beaten_by + std::to_string(++n);  // the other put lands first
    return false;
  };
  detail::Error ec;
  EXPECT_EQ(detail::fenced_put_by_cas("k", "7\nmine", get, create, replace, ec), "7\nmine");
  EXPECT_FALSE(ec) << ec.detail();
  EXPECT_EQ(gets, 2);
  EXPECT_EQ(replaces, 1);

  record = "7\nfirst";
  beaten_by = "8\nnewer";
  n = gets = replaces = 0;
  ec.clear();
  EXPECT_EQ(detail::fenced_put_by_cas("k", "7\nmine", get, create, replace, ec), "8\nnewer1");
  EXPECT_FALSE(ec) << ec.detail();

  // A compare-and-set that fails without a change (ZooKeeper's lost connection): read
  // again and write; the unchanged record of the same term is not another writer's put.
  record = "7\nfirst";
  int flaky = 1;
  const auto replace_flaky = [&](std::string_view expected, detail::Error&) {
    if (flaky-- > 0 || record != expected) return false;
    record = "7\nmine";
    return true;
  };
  ec.clear();
  EXPECT_EQ(detail::fenced_put_by_cas("k", "7\nmine", get, create, replace_flaky, ec), "7\nmine");
  EXPECT_FALSE(ec) << ec.detail();
  EXPECT_EQ(record, "7\nmine") << "reported stored, not written";

  record = "5\nolder";  // beaten by older terms every time: still bounded, 16 rounds
  beaten_by = "6\nolder";
  n = gets = replaces = 0;
  ec.clear();
  EXPECT_EQ(detail::fenced_put_by_cas("k", "7\nmine", get, create, replace, ec), "");
  EXPECT_EQ(ec, distlock::errc::backend_unavailable);
  EXPECT_EQ(replaces, 16);
}

INSTANTIATE_TEST_SUITE_P(Backends, ElectionFence, ::testing::ValuesIn(kinds()),
                         [](const auto& param_info) { return param_info.param.label; });

}  // namespace

}  // namespace distlock::testing
