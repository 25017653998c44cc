// The redis+cluster:// backend's release watches (sharded pub/sub per node), the mover
// thread that follows a moved slot, and the check of new masters' configuration.
#include "rediscluster/cluster_backend_impl.hpp"

namespace distlock::detail::rediscluster {

void ClusterBackend::watch(std::string_view name, Error& ec) {
  ec.clear();
  const NameKeys k = rediscluster::keys_of(prefix_, name);
  LockGuard w(watch_mu_);
  {
    LockGuard lk(names_mu_);
    channel_names_[k.channel] = std::string(name);
  }
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    Node* node = node_for(k.slot, ec);
    if (node == nullptr) break;
    redis::Subscriber& sub = subscriber_of(*node);
    sub.watch(k.channel, ec);
    if (!ec) {
      watched_[std::string(name)] = Watch{node, k.channel};
      return;
    }
    Redirect to;
    bool ask = false;
    if (!find_redirect(ec.detail(), node->opts.host, to, ask)) break;
    if (!ask) learn_redirect_to(to);
    refresh_map_quietly();
    if (ask) std::this_thread::sleep_for(Millis(10 * (attempt + 1)));  // the slot is being moved
  }
  {
    LockGuard lk(names_mu_);
    channel_names_.erase(k.channel);
  }
  if (!ec) ec = make_error_code(errc::backend_unavailable);
  const std::string why = ec.detail();
  log_.log(LogLevel::warning, "cannot wait for a release of \"{}\": {}", name, why);
  ec.set_detail("cannot wait for a release of \"" + std::string(name) + "\": " + why);
}

void ClusterBackend::unwatch(std::string_view name) noexcept {
  try {
    LockGuard w(watch_mu_);
    auto it = watched_.find(name);
    if (it == watched_.end()) return;
    subscriber_of(*it->second.node).unwatch(it->second.channel);
    {
      LockGuard lk(names_mu_);
      channel_names_.erase(it->second.channel);
    }
    watched_.erase(it);
  } catch (...) {  // out of memory: the subscription stays, harmless
  }
}

// Runs check_config() on every master of the map not checked yet (on the mover).
void ClusterBackend::check_new_masters() {
  std::vector<Node*> masters;
  {
    LockGuard lk(map_mu_);
    for (Node* n : slots_) {
      if (n != nullptr && !n->config_checked.load() &&
          std::find(masters.begin(), masters.end(), n) == masters.end()) {
        masters.push_back(n);
      }
    }
  }
  for (Node* n : masters) check_config(*n);
}

// CONFIG GET appendonly / maxmemory / maxmemory-policy on one master, as redis://
// does at connect: a master that loses writes on a restart or evicts keys breaks
// guarantees the scripts alone cannot keep; say so once per node, with the
// consequence. CONFIG renamed or denied by an ACL: a debug line, never a failure.
// An unreachable node is checked again after the next map refresh.
void ClusterBackend::check_config(Node& node) {
  Error ec;
  auto conn = node.pool.checkout(ec);
  if (ec) return;
  node.config_checked.store(true);
  conn->append({"CONFIG", "GET", "appendonly"});
  conn->append({"CONFIG", "GET", "maxmemory"});
  conn->append({"CONFIG", "GET", "maxmemory-policy"});
  std::vector<Reply> r = conn->read_replies(3, ec);
  auto value = [&](std::size_t i) -> std::string_view {
    const redisReply* x = r[i].get();
    if (x == nullptr || x->type != REDIS_REPLY_ARRAY || x->elements != 2) return {};
    return redis::reply_str(x->element[1]);
  };
  const std::string who = node.opts.describe();
  if (!ec) {
    for (const auto& one : r) {
      if (!redis::is_error(one.get())) continue;
      log_.log(LogLevel::debug,
               "{}: CONFIG GET is not available ({}): appendonly and maxmemory-policy not checked", who,
               redis::reply_str(one.get()));
      return;
    }
  }
  if (ec || value(0).empty() || value(2).empty()) {
    log_.log(LogLevel::debug,
             "{}: CONFIG GET gave no answer ({}): appendonly and maxmemory-policy not checked", who,
             ec ? ec.detail() : std::string("unexpected reply"));
    return;
  }
  bool fine = true;
  if (value(0) != "yes") {
    fine = false;
    log_.log(LogLevel::warning,
             "{} runs with appendonly no: a restart loses (or restores stale) the locks of its slots, so a "
             "second client can acquire a lock whose holder has not noticed yet; fencing tokens then "
             "continue from the server clock and stay increasing only if that clock did not step back "
             "(docs/redis-cluster.md)",
             who);
  }
  const std::string_view policy = value(2);
  if (policy != "noeviction" && value(1) != "0") {
    fine = false;
    const bool all = policy.substr(0, 7) == "allkeys";
    log_.log(LogLevel::warning,
             "{} runs with maxmemory {} and maxmemory-policy {}: under memory pressure it may evict held "
             "locks{} (a second client then acquires while the holder has not noticed yet); use "
             "noeviction (docs/redis-cluster.md)",
             who, value(1), policy,
             all ? " and fence counters (tokens then continue from the server clock)" : "");
  }
  if (fine)
    log_.log(LogLevel::debug, "{}: appendonly yes, maxmemory-policy {}: configuration checked", who, policy);
}

redis::Subscriber& ClusterBackend::subscriber_of(Node& node) {
  LockGuard lk(map_mu_);
  if (!node.sub) {
    Node* n = &node;
    node.sub = std::make_unique<redis::Subscriber>(
        node.opts, [this](std::string_view channel) { on_channel(channel); },
        [this, n](std::string_view channel) { on_dropped(n, channel); });
    // Every name's release channel starts so (keys_of): its messages come with their payload,
    // the grants of the wait queue among them (cluster_queue.cpp).
    node.sub->set_payload_prefix_handler(
        prefix_ + ":{",
        [this](std::string_view channel, std::string_view payload) { on_name_message(channel, payload); });
  }
  return *node.sub;
}

void ClusterBackend::on_channel(std::string_view channel) {
  std::string name;
  {
    LockGuard lk(names_mu_);
    auto it = channel_names_.find(channel);
    if (it == channel_names_.end()) return;
    name = it->second;
  }
  ChangeListener* l = listener_.load();
  if (l) l->on_change(name);
}

// On a subscriber thread: hand the move to the mover (watch() blocks on
// confirmations, which a subscriber thread must not wait for).
void ClusterBackend::on_dropped(Node* node, std::string_view channel) {
  {
    LockGuard lk(move_mu_);
    moves_.emplace_back(node, std::string(channel));
  }
  move_cv_.notify_all();
}

// Watches a dropped channel again on the node now serving its slot, then tells
// the waiters to re-check (a release may have come while nobody listened).
void ClusterBackend::run_mover() {
  Millis backoff{20};
  for (;;) {
    std::pair<Node*, std::string> item;
    bool refresh = false, check = false;
    {
      UniqueLock lk(move_mu_);
      while (!stop_ && moves_.empty() && !refresh_wanted_ && !check_wanted_) move_cv_.wait(lk.native());
      if (stop_) return;
      refresh = std::exchange(refresh_wanted_, false);
      check = std::exchange(check_wanted_, false);
      if (!moves_.empty()) {
        item = std::move(moves_.front());
        moves_.pop_front();
      }
    }
    if (refresh) {
      refresh_map_quietly();
    }
    if (check) check_new_masters();
    if (item.first == nullptr) continue;
    std::string name;
    bool again = false;
    {
      LockGuard w(watch_mu_);
      {
        LockGuard lk(names_mu_);
        auto it = channel_names_.find(item.second);
        if (it != channel_names_.end()) name = it->second;
      }
      auto wit = name.empty() ? watched_.end() : watched_.find(name);
      if (wit == watched_.end() || wit->second.node != item.first) continue;  // unwatched or moved already
      Error ec;
      refresh_map(map_version(), ec);
      const NameKeys k = rediscluster::keys_of(prefix_, name);
      Node* to = node_for(k.slot, ec);
      if (to != nullptr) subscriber_of(*to).watch(k.channel, ec);
      if (to != nullptr && !ec) {
        subscriber_of(*item.first).unwatch(k.channel);
        wit->second.node = to;
        backoff = Millis(20);
      } else {
        log_.log(LogLevel::debug, "watching \"{}\" on the node now serving its slot failed: {}", name,
                 ec.detail());
        Redirect r;
        bool ask = false;
        if (find_redirect(ec.detail(), item.first->opts.host, r, ask) && !ask) learn_redirect_to(r);
        again = true;
      }
    }
    ChangeListener* l = listener_.load();
    if (l) l->on_change(name);
    if (again) {
      UniqueLock lk(move_mu_);
      moves_.push_back(std::move(item));
      const auto until = std::chrono::steady_clock::now() + backoff;
      while (!stop_ && move_cv_.wait_until(lk.native(), until) != std::cv_status::timeout) {
      }
      backoff = std::min(backoff * 2, Millis(1000));
    }
  }
}

}  // namespace distlock::detail::rediscluster
