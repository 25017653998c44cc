// The redis+cluster:// backend's renewal: one pipeline per node, sent by that node's
// renewal worker, waited for within a budget.
#include "rediscluster/cluster_backend_impl.hpp"

namespace distlock::detail::rediscluster {

namespace {
// KEYS[1] a lease's lock-delay marker (value D); ARGV[1] ttl (ms). Moves the marker to
// ttl + D from now, never shorter than it is: 1; no marker: 0. Used where a migration has
// split a lock from its marker (each node lacks one of them, a script naming both is refused
// with TRYAGAIN): the marker moves first, alone, then the lock alone (docs/redis-cluster.md
// "Lock-delay").
const redis::Script& split_marker_renew_script() {
  static const redis::Script& s = *new redis::Script(R"lua(
local d = tonumber(redis.call('GET', KEYS[1]))
if not d or d <= 0 then
  return 0
end
local px = tonumber(ARGV[1]) + d
if redis.call('PTTL', KEYS[1]) < px then
  redis.call('PEXPIRE', KEYS[1], string.format('%.0f', px))
end
return 1
)lua");
  return s;
}
}  // namespace

// One pipeline per node (EVALSHA per slot: a script's keys must share a slot),
// all nodes at once: each node's pipeline is sent and read by that node's renewal
// worker, and the call waits for the answers at most renew_budget() (a quarter of
// the shortest TTL in the batch, at most the command timeout). A node that has
// not answered by then leaves its items `failed` and the others' statuses are
// returned at once; while its pipeline is still in flight it gets no new one (its
// items fail at once). Items redirected (the slot moved since the map was read) are
// retried through route() within the same budget. The slot map is never read
// here: an unreachable node asks the mover thread for a refresh.
void ClusterBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  std::fill(out.begin(), out.end(), RenewStatus::failed);
  if (items.empty()) return;
  const auto deadline = std::chrono::steady_clock::now() + renew_budget(items);
  std::vector<NameKeys> keys;
  std::vector<std::string> ttls;
  std::vector<char> delayed;  // acquired with a lock_delay: its marker moves with it
  keys.reserve(items.size());
  ttls.reserve(items.size());
  delayed.reserve(items.size());
  for (const auto& it : items) {
    keys.push_back(rediscluster::keys_of(prefix_, it.name));
    ttls.push_back(std::to_string(it.ttl.count()));
    delayed.push_back(is_delayed(it.name, it.owner) ? 1 : 0);
  }
  std::map<Node*, std::vector<std::size_t>> by_node;
  std::vector<std::size_t> retry;  // unrouted, then redirected items
  {
    LockGuard lk(map_mu_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      Node* n = slots_[keys[i].slot];
      if (n) {
        by_node[n].push_back(i);
      } else {
        retry.push_back(i);
      }
    }
  }
  struct Sent {
    Node* node;
    std::vector<std::size_t> idx;      // item indexes, in pipeline order
    std::vector<std::size_t> call_at;  // first position in idx of each call
    std::shared_ptr<RenewJob> job;
  };
  std::vector<Sent> sent;
  sent.reserve(by_node.size());
  for (auto& [node, idx] : by_node) {
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      return std::pair(delayed[a], keys[a].slot) < std::pair(delayed[b], keys[b].slot);
    });
    auto job = std::make_shared<RenewJob>();
    job->keys.reserve(idx.size());
    job->args.reserve(2 * idx.size());
    std::vector<std::size_t> call_at;
    // One call per run of one slot and one kind (with or without markers), at most
    // kRenewChunk locks: a call's keys are its locks, then (delayed) their markers.
    for (std::size_t at = 0; at < idx.size();) {
      std::size_t end = at + 1;
      while (end < idx.size() && end - at < kRenewChunk && keys[idx[end]].slot == keys[idx[at]].slot &&
             delayed[idx[end]] == delayed[idx[at]])
        ++end;
      for (std::size_t j = at; j < end; ++j) {
        job->keys.push_back(keys[idx[j]].lock);
        job->args.emplace_back(items[idx[j]].owner);
        job->args.push_back(ttls[idx[j]]);
      }
      if (delayed[idx[at]]) {
        for (std::size_t j = at; j < end; ++j) job->keys.push_back(keys[idx[j]].delay);
      }
      job->call_sizes.push_back(end - at);
      job->call_delayed.push_back(delayed[idx[at]] != 0);
      call_at.push_back(at);
      at = end;
    }
    sent.push_back({node, std::move(idx), std::move(call_at), std::move(job)});
  }
  // Hand each node its pipeline, then wait for all of them, up to the deadline.
  std::vector<Node*> stuck, late;
  {
    UniqueLock lk(work_mu_);
    for (auto& s : sent) {
      if (s.node->renewal_stuck.load()) {  // its previous pipeline is still unanswered
        stuck.push_back(s.node);
        s.job.reset();
        continue;
      }
      if (!s.node->worker.joinable()) {
        Node* n = s.node;
        n->worker = std::thread([this, n] { run_renewal_worker(*n); });
      }
      s.node->jobs.push_back(s.job);
      s.node->work_cv.notify_one();
    }
    done_cv_.wait_until(lk.native(), deadline, [&] {
      return std::all_of(sent.begin(), sent.end(), [](const Sent& s) { return !s.job || s.job->done; });
    });
    for (auto& s : sent) {
      if (!s.job || s.job->done) continue;
      s.job->abandoned = true;  // the worker skips it if it has not started yet
      s.node->renewal_stuck.store(true);
      late.push_back(s.node);
      s.job.reset();
    }
  }
  const auto budget_ms = std::chrono::duration_cast<Millis>(renew_budget(items)).count();
  for (Node* n : stuck) {
    report(*n, "renew: " + n->opts.describe() + " has not answered an earlier renewal yet");
  }
  for (Node* n : late) {
    report(*n,
           "renew: " + n->opts.describe() + " did not answer within " + std::to_string(budget_ms) + " ms");
  }
  if (!stuck.empty() || !late.empty()) request_refresh();
  std::size_t answered = 0;
  for (auto& s : sent) {
    if (!s.job) continue;
    RenewJob& job = *s.job;
    if (job.ec) {
      report(*s.node, "renew: " + job.ec.detail());
      request_refresh();
      continue;
    }
    ++answered;
    ok(*s.node);
    for (std::size_t c = 0; c < job.call_sizes.size(); ++c) {
      const redisReply* r = c < job.replies.size() ? job.replies[c].get() : nullptr;
      const std::size_t at = s.call_at[c];
      if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == job.call_sizes[c]) {
        for (std::size_t j = 0; j < r->elements; ++j) {
          const redisReply* e = r->element[j];
          out[s.idx[at + j]] = e->type == REDIS_REPLY_INTEGER && e->integer == 1 ? RenewStatus::renewed
                                                                                 : RenewStatus::not_owner;
        }
        continue;
      }
      const std::string_view text = redis::reply_str(r);
      if (starts_with(text, "MOVED ") || starts_with(text, "ASK ") || starts_with(text, "TRYAGAIN")) {
        for (std::size_t j = 0; j < job.call_sizes[c]; ++j) retry.push_back(s.idx[at + j]);
        if (starts_with(text, "MOVED ")) learn_redirect(text, s.node->opts.host);
      } else {
        log_.log(LogLevel::warning, "{}: renew script answered {}", s.node->opts.describe(),
                 r && r->type == REDIS_REPLY_ERROR ? text : std::string_view("an unexpected reply"));
      }
    }
  }
  // Redirected or unrouted items: one routed call each (rare: a slot moved), while
  // the budget lasts; the rest stay `failed` (the engine retries them soon).
  for (std::size_t i : retry) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    Error rec;  // per-item failures are retried by the engine, not reported
    Reply r;
    const std::string_view key_pair[] = {keys[i].lock, keys[i].delay};
    const std::string_view args[] = {items[i].owner, ttls[i]};
    const bool with_marker = delayed[i] != 0;
    const redis::Script& script =
        with_marker ? redis::lock_renew_delayed_script() : redis::lock_renew_script();
    bool split = false;  // the lock and its marker are on two nodes (a migration under way)
    const redisReply* d = route(
        keys[i].slot, "renew",
        [&](Connection& c, bool, Error& e) {
          r = script.run(c, std::span(key_pair, with_marker ? 2 : 1), std::span(args), e);
          if (with_marker && r && r->type == REDIS_REPLY_ERROR &&
              starts_with(redis::reply_str(r.get()), "TRYAGAIN")) {
            // Answered below, one key at a time; a PING's answer ends the routing here
            // (an error reply would be retried, a null one would count the node failed).
            split = true;
            r = c.command({"PING"}, e);
          }
          return r.get();
        },
        rec);
    if (split) {
      // The marker first (alone: ASK finds the node that has it), and only once it moved the
      // lock (alone): a marker that did not move leaves the lease unrenewed, never a renewed
      // lease whose marker would end before its end + D.
      Error mec;
      Reply mr;
      const redisReply* md = route(
          keys[i].slot, "renew (marker)",
          [&](Connection& c, bool, Error& e) {
            mr = split_marker_renew_script().run(c, std::span(&key_pair[1], 1), std::span(&args[1], 1), e);
            return mr.get();
          },
          mec);
      if (md == nullptr || mec || md->type != REDIS_REPLY_INTEGER) continue;
      rec.clear();
      d = route(
          keys[i].slot, "renew (lock)",
          [&](Connection& c, bool, Error& e) {
            r = redis::lock_renew_script().run(c, std::span(key_pair, 1), std::span(args), e);
            return r.get();
          },
          rec);
    }
    if (d == nullptr || rec) continue;
    ++answered;
    if (d->type == REDIS_REPLY_ARRAY && d->elements == 1) {
      const redisReply* e = d->element[0];
      out[i] =
          e->type == REDIS_REPLY_INTEGER && e->integer == 1 ? RenewStatus::renewed : RenewStatus::not_owner;
    }
  }
  if (answered == 0) ec = make_error_code(errc::backend_unavailable);
}

// A quarter of the shortest TTL of the batch, at most the command timeout: the
// engine renews a lease at least a quarter of its TTL before its local deadline
// (renew_interval <= ttl/2, safety_margin < ttl/3, renewed up to a quarter
// interval early), so the answers of the nodes that answered arrive in time.
Millis ClusterBackend::renew_budget(std::span<const RenewItem> items) const {
  Millis shortest = items.front().ttl;
  for (const auto& it : items) shortest = std::min(shortest, it.ttl);
  return std::max(Millis(1), std::min(base_.command_timeout, shortest / 4));
}

// The loop of a node's renewal worker: runs the node's pipelines one after the
// other; a pipeline whose caller already stopped waiting is not sent.
void ClusterBackend::run_renewal_worker(Node& node) {
  for (;;) {
    std::shared_ptr<RenewJob> job;
    {
      UniqueLock lk(work_mu_);
      node.renewal_stuck.store(false);  // back: free for the next pipeline
      while (!work_stop_ && node.jobs.empty()) node.work_cv.wait(lk.native());
      if (work_stop_) return;
      job = std::move(node.jobs.front());
      node.jobs.pop_front();
      if (job->abandoned) continue;
    }
    try {
      run_renewal(node, *job);
    } catch (...) {  // out of memory
      job->ec.fail(errc::protocol_error, node.opts.describe() + ": renewal failed (out of memory)");
    }
    {
      LockGuard lk(work_mu_);
      job->done = true;
    }
    done_cv_.notify_all();
  }
}

void ClusterBackend::run_renewal(Node& node, RenewJob& job) {
  auto conn = node.pool.checkout(job.ec);
  if (job.ec) return;
  const std::vector<std::string_view> key_views(job.keys.begin(), job.keys.end());
  const std::vector<std::string_view> arg_views(job.args.begin(), job.args.end());
  // Consecutive calls of one kind go in one pipeline (a pipeline runs one script).
  std::size_t key_at = 0, arg_at = 0;
  for (std::size_t c = 0; c < job.call_sizes.size();) {
    const bool with_marker = job.call_delayed[c];
    std::vector<Script::Call> calls;
    for (; c < job.call_sizes.size() && job.call_delayed[c] == with_marker; ++c) {
      const std::size_t n = job.call_sizes[c];
      const std::size_t nkeys = with_marker ? 2 * n : n;
      calls.push_back(
          {std::span(key_views).subspan(key_at, nkeys), std::span(arg_views).subspan(arg_at, 2 * n)});
      key_at += nkeys;
      arg_at += 2 * n;
    }
    const redis::Script& script =
        with_marker ? redis::lock_renew_delayed_script() : redis::lock_renew_script();
    std::vector<Reply> replies = script.run_pipelined(*conn, calls, job.ec);
    if (job.ec) return;
    for (auto& r : replies) job.replies.push_back(std::move(r));
  }
}

}  // namespace distlock::detail::rediscluster
