// The redis+cluster:// backend's slot map (CLUSTER SLOTS, the nodes, the URL's nat map)
// and its routing of a call to a slot's master, following MOVED, ASK and TRYAGAIN.
#include "rediscluster/cluster_backend_impl.hpp"

namespace distlock::detail::rediscluster {

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

bool parse_redirect(std::string_view text, std::string_view default_host, Redirect& out) {
  const auto sp1 = text.find(' ');
  if (sp1 == std::string_view::npos) return false;
  const auto sp2 = text.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return false;
  std::string_view slot = text.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view addr = text.substr(sp2 + 1);
  if (auto end = addr.find_first_of(" \r\n"); end != std::string_view::npos) addr = addr.substr(0, end);
  const auto colon = addr.rfind(':');
  if (colon == std::string_view::npos) return false;
  unsigned s = 0, p = 0;
  auto r1 = std::from_chars(slot.data(), slot.data() + slot.size(), s);
  const std::string_view port = addr.substr(colon + 1);
  auto r2 = std::from_chars(port.data(), port.data() + port.size(), p);
  if (r1.ec != std::errc{} || r2.ec != std::errc{} || s >= kSlots || p == 0 || p > 65535) return false;
  out.slot = static_cast<std::uint16_t>(s);
  out.host = colon == 0 ? std::string(default_host) : std::string(addr.substr(0, colon));
  if (!out.host.empty() && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  out.port = static_cast<std::uint16_t>(p);
  return true;
}

// A redirect named inside a longer message (a refused SSUBSCRIBE's text).
bool find_redirect(std::string_view text, std::string_view default_host, Redirect& out, bool& ask) {
  for (std::string_view kind : {"MOVED ", "ASK "}) {
    const auto at = text.find(std::string(": ") + std::string(kind));
    if (at != std::string_view::npos) {
      ask = kind == "ASK ";
      return parse_redirect(text.substr(at + 2), default_host, out);
    }
  }
  return false;
}

// Every master of the slot map, once; reads the map again when a slot has no
// master (backend_unavailable naming the slot when it still has none).
std::vector<Node*> ClusterBackend::all_masters(Error& ec) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::vector<Node*> out;
    std::size_t unserved = kSlots;
    std::uint64_t version = 0;
    {
      LockGuard lk(map_mu_);
      version = map_version_;
      for (std::size_t s = 0; s < kSlots; ++s) {
        Node* n = slots_[s];
        if (n == nullptr) {
          if (unserved == kSlots) unserved = s;
        } else if (std::find(out.begin(), out.end(), n) == out.end()) {
          out.push_back(n);
        }
      }
    }
    if (unserved == kSlots) return out;
    if (attempt == 0 && !refresh_map(version, ec)) return {};
    if (attempt == 1) {
      ec.fail(errc::backend_unavailable,
              "slot " + std::to_string(unserved) + " is served by no node of the cluster " + url_);
    }
  }
  return {};
}

// Runs `attempt` on the node serving `slot`, following MOVED (map updated, then
// refreshed), ASK (ASKING on the named node, once per ASK) and TRYAGAIN (a short
// pause) at most kMaxAttempts times. Returns the attempt's reply (an error reply
// other than a redirection is returned with `ec` as the attempt set it), or
// nullptr with `ec` and an error detail naming the node and the cause.
const redisReply* ClusterBackend::route(std::uint16_t slot, const char* what, const Attempt& attempt,
                                        Error& ec) {
  ec.clear();
  Node* ask_node = nullptr;
  std::string last;
  for (int i = 0; i < kMaxAttempts; ++i) {
    Node* node = ask_node;
    if (node == nullptr) node = node_for(slot, ec);
    if (node == nullptr) return nullptr;
    const bool asking = ask_node != nullptr;
    ask_node = nullptr;
    auto conn = node->pool.checkout(ec);
    if (ec) {
      report(*node, ec.detail());
      refresh_after_failure();
      return nullptr;
    }
    if (asking) {
      conn->command({"ASKING"}, ec);
      if (ec) {
        failed(*node, what, ec);
        return nullptr;
      }
    }
    const redisReply* r = attempt(*conn, asking, ec);
    if (r == nullptr) {
      if (!ec) ec = make_error_code(errc::protocol_error);
      failed(*node, what, ec);
      refresh_after_failure();
      return nullptr;
    }
    if (r->type != REDIS_REPLY_ERROR) {
      ok(*node);
      return r;
    }
    const std::string text(redis::reply_str(r));
    if (starts_with(text, "MOVED ")) {
      last = node->opts.describe() + " answered " + text;
      learn_redirect(text, node->opts.host);
      refresh_map_quietly();
      ec.clear();
      continue;
    }
    if (starts_with(text, "ASK ")) {
      last = node->opts.describe() + " answered " + text;
      Redirect to;
      if (parse_redirect(text, node->opts.host, to)) {
        ask_node = node_at(to.host, to.port);
        ec.clear();
        continue;
      }
    }
    if (starts_with(text, "TRYAGAIN")) {  // keys of one slot split by a migration in progress
      last = node->opts.describe() + " answered " + text;
      ec.clear();
      std::this_thread::sleep_for(std::min(Millis(10) * (1 << i), Millis(320)));
      continue;
    }
    if (starts_with(text, "CLUSTERDOWN")) refresh_after_failure();
    ok(*node);
    const std::string msg = node->opts.describe() + ": " + what + ": " + text;
    log_.log(LogLevel::warning, "{}", msg);
    ec.set_detail(msg);
    if (!ec) ec = redis::error_code_of(r);
    return r;
  }
  ec = make_error_code(errc::backend_unavailable);
  const std::string msg = std::string(what) + ": slot " + std::to_string(slot) +
                          " was still redirected after " + std::to_string(kMaxAttempts) +
                          " attempts (last: " + last + ")";
  log_.log(LogLevel::warning, "{}", msg);
  ec.set_detail(msg);
  return nullptr;
}

// `host:port` as the cluster announces it, translated by the URL's nat map.
Node* ClusterBackend::node_at_locked(const std::string& announced_host, std::uint16_t announced_port) {
  std::string host = announced_host;
  std::uint16_t port = announced_port;
  if (auto it = nat_.find(announced_host + ":" + std::to_string(announced_port)); it != nat_.end()) {
    host = it->second.first;
    port = it->second.second;
  }
  const std::string addr = host + "|" + std::to_string(port);
  auto it = nodes_.find(addr);
  if (it != nodes_.end()) return it->second.get();
  ConnectionOptions o = base_;
  o.host = host;
  o.port = port;
  return nodes_.emplace(addr, std::make_unique<Node>(o)).first->second.get();
}

// The node serving `slot`; reads the map again once when none does.
Node* ClusterBackend::node_for(std::uint16_t slot, Error& ec) {
  std::uint64_t version = 0;
  {
    LockGuard lk(map_mu_);
    if (slots_[slot] != nullptr) return slots_[slot];
    version = map_version_;
  }
  if (refresh_map(version, ec)) {
    LockGuard lk(map_mu_);
    if (slots_[slot] != nullptr) return slots_[slot];
  }
  if (!ec) {
    ec.fail(errc::backend_unavailable,
            "slot " + std::to_string(slot) + " is served by no node of the cluster " + url_);
  }
  return nullptr;
}

void ClusterBackend::refresh_after_failure() {
  const auto now = std::chrono::steady_clock::now();
  {
    LockGuard lk(map_mu_);
    if (now - last_failure_refresh_ < kRefreshOnFailureEvery) return;
    last_failure_refresh_ = now;
  }
  refresh_map_quietly();
}

// As refresh_after_failure(), but on the mover thread: the caller (a renewal)
// does not wait for CLUSTER SLOTS.
void ClusterBackend::request_refresh() {
  const auto now = std::chrono::steady_clock::now();
  {
    LockGuard lk(map_mu_);
    if (now - last_failure_refresh_ < kRefreshOnFailureEvery) return;
    last_failure_refresh_ = now;
  }
  {
    LockGuard lk(move_mu_);
    refresh_wanted_ = true;
  }
  move_cv_.notify_all();
}

// CLUSTER SLOTS from the first known node that answers (the nodes of the current
// map first, then the URL's seeds). Skipped when another thread refreshed since
// `seen_version`. False with ec (every node's failure in its detail) when no node answered.
bool ClusterBackend::refresh_map(std::uint64_t seen_version, Error& ec) {
  std::lock_guard refresh(refresh_mu_);
  std::vector<Node*> order;
  {
    LockGuard lk(map_mu_);
    if (map_version_ != seen_version) return true;
    for (Node* n : slots_) {
      if (n != nullptr && std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
    }
    for (auto& [addr, n] : nodes_) {
      if (std::find(order.begin(), order.end(), n.get()) == order.end()) order.push_back(n.get());
    }
  }
  // A node known to hang (a renewal pipeline still unanswered) last.
  std::stable_partition(order.begin(), order.end(), [](const Node* n) { return !n->renewal_stuck.load(); });
  std::string errors;
  std::error_code first_ec;
  for (Node* n : order) {
    Error nec;
    if (load_map_from(*n, nec)) {
      ec.clear();
      return true;
    }
    if (!first_ec || nec == errc::auth_failed || nec == errc::protocol_error) first_ec = nec;
    if (!errors.empty()) errors += "; ";
    errors += nec.detail();
  }
  ec.fail(first_ec ? first_ec : make_error_code(errc::backend_unavailable),
          "no node of the cluster " + url_ + " gave its slot map: " + errors);
  return false;
}

bool ClusterBackend::load_map_from(Node& node, Error& ec) {
  auto conn = node.pool.checkout(ec);
  if (ec) return false;
  Reply r = conn->command({"CLUSTER", "SLOTS"}, ec);
  if (!r) return false;
  if (r->type == REDIS_REPLY_ERROR) {
    const std::string_view text = redis::reply_str(r.get());
    if (text.find("cluster support disabled") != std::string_view::npos) {
      ec.fail(errc::protocol_error, node.opts.describe() + " is not a cluster node (" + std::string(text) +
                                        "): use redis:// for a single server");
    } else {
      ec.fail(ec == errc::auth_failed ? std::error_code(ec) : make_error_code(errc::protocol_error),
              node.opts.describe() + ": CLUSTER SLOTS: " + std::string(text));
    }
    return false;
  }
  ec.clear();
  if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
    ec.fail(
        errc::backend_unavailable,
        node.opts.describe() + " serves no slots yet (CLUSTER SLOTS is empty: the cluster is not set up)");
    return false;
  }
  std::vector<std::tuple<std::size_t, std::size_t, std::string, std::uint16_t>> ranges;
  for (std::size_t i = 0; i < r->elements; ++i) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
        e->element[2]->elements < 2 || e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      ec.fail(errc::protocol_error, node.opts.describe() + ": unexpected CLUSTER SLOTS reply");
      return false;
    }
    const long long from = e->element[0]->integer, to = e->element[1]->integer;
    const long long port = e->element[2]->element[1]->integer;
    std::string host(redis::reply_str(e->element[2]->element[0]));
    if (host.empty() || host == "?") host = node.opts.host;
    if (from < 0 || to < from || to >= static_cast<long long>(kSlots) || port <= 0 || port > 65535) {
      ec.fail(errc::protocol_error,
              node.opts.describe() + ": CLUSTER SLOTS names an impossible range or port");
      return false;
    }
    ranges.emplace_back(from, to, host, static_cast<std::uint16_t>(port));
  }
  {
    LockGuard lk(map_mu_);
    std::fill(slots_.begin(), slots_.end(), nullptr);
    for (auto& [from, to, host, port] : ranges) {
      Node* n = node_at_locked(host, port);
      for (std::size_t s = from; s <= to; ++s) slots_[s] = n;
    }
    ++map_version_;
  }
  {
    LockGuard lk(move_mu_);
    check_wanted_ = true;  // masters new in the map get their configuration checked
  }
  move_cv_.notify_all();
  return true;
}

}  // namespace distlock::detail::rediscluster
