#include "zk/zk_records.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "zk/zk_call.hpp"
#include "zk/zk_names.hpp"

namespace distlock::detail::zk {

namespace {

// Rounds one record call may take when the connection drops under it or other clients
// create and delete the same record between our steps.
constexpr int kRounds = 8;
// Lock directories whose queues one pipelined round trip reads while listing.
constexpr std::size_t kListBatch = 64;
// A listed lock whose holder left between reading its queue and its node is read again
// at most this often.
constexpr int kRecheck = 3;

std::string record_path(std::string_view key) {
  std::string p(kRecordsDir);
  p.push_back('/');
  p += encode_component(key);
  return p;
}

// Retrying helps: the connection dropped (the request may or may not have been applied).
// A request with no answer at all ends the call: the server counts as unavailable.
bool retry_after(int rc) {
  return is_transient(rc) && rc != kTimedOut;
}

}  // namespace

void Records::fail(int rc, std::string_view what, Error& ec) const {
  std::string why = fmt::format("ZooKeeper at {}: {} failed: {}", env_.url, what, describe(rc));
  if (rc == ZNOAUTH || rc == ZAUTHFAILED) {
    ec = make_error_code(errc::auth_failed);
    why +=
        "; the records of a chroot belong to the user who wrote the first one (other users may only "
        "read them)";
  } else if (is_transient(rc)) {
    ec = make_error_code(errc::backend_unavailable);
  } else {
    ec = make_error_code(rc == ZBADARGUMENTS ? errc::invalid_argument : errc::protocol_error);
  }
  ec.set_detail(std::move(why));
}

int Records::ensure_dir(zhandle_t* zh, Clock::time_point deadline) const {
  // Pipelined; "already exists" is success.
  auto root = submit_create(zh, std::string(kRoot), {}, env_.root_acl, ZOO_PERSISTENT);
  root->undo_if_abandoned = false;
  auto dir = submit_create(zh, std::string(kRecordsDir), {}, env_.node_acl, ZOO_PERSISTENT);
  dir->undo_if_abandoned = false;
  int rc = await(root, deadline);
  if (rc != ZOK && rc != ZNODEEXISTS) return rc;
  rc = await(dir, deadline);
  return rc == ZNODEEXISTS ? ZOK : rc;
}

std::string Records::put(std::string_view key, std::string_view value, PutMode mode, Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  const std::string path = record_path(key);
  if (mode == PutMode::fenced) {
    // A compare-and-set loop: setData at the version whose data was the value read.
    const auto replace = [&](std::string_view expected, Error& e) {
      std::shared_ptr<void> hold;
      zhandle_t* zh = env_.session(env_.clock->now() + env_.connect_timeout + env_.command_timeout, hold);
      if (zh == nullptr) {
        fail(kTimedOut, "waiting for a connection to store a record", e);
        return false;
      }
      const Clock::time_point deadline = env_.clock->now() + env_.command_timeout;
      auto got = submit_get(zh, path);
      int rc = await(got, deadline);
      if (rc == ZOK) {
        if (got->value != expected) return false;  // changed since: decide again
        rc = await(submit_set(zh, path, value, got->stat.version), deadline);
        if (rc == ZOK) return true;
        if (rc == ZBADVERSION) return false;
      }
      if (rc == ZNONODE || retry_after(rc)) return false;  // read again (a set applied reads back as ours)
      fail(rc, "replacing record " + path, e);
      return false;
    };
    return fenced_put_by_cas(
        key, value, [&](Error& e) { return get(key, e); },
        [&](Error& e) { return put(key, value, PutMode::if_absent, e); }, replace, ec);
  }
  const Clock::time_point budget = env_.clock->now() + env_.connect_timeout + env_.command_timeout;
  std::shared_ptr<void> keep;
  for (int round = 0; round < kRounds; ++round) {
    zhandle_t* zh = env_.session(budget, keep);
    if (zh == nullptr) {
      fail(kTimedOut, "waiting for a connection to store a record", ec);
      return {};
    }
    const Clock::time_point deadline = env_.clock->now() + env_.command_timeout;
    int rc = ZNONODE;
    if (mode == PutMode::always) {
      rc = await(submit_set(zh, path, value, -1), deadline);
      if (rc == ZOK) return std::string(value);
      if (retry_after(rc)) continue;
      if (rc != ZNONODE) {
        fail(rc, "setting record " + path, ec);
        return {};
      }
    }
    // A record is never undone when its create times out: another client may have read
    // it by then. The caller sees an error and does not know; a retry reads it.
    auto created = submit_create(zh, path, value, env_.node_acl, ZOO_PERSISTENT);
    created->undo_if_abandoned = false;
    rc = await(created, deadline);
    if (rc == ZOK) return std::string(value);
    if (rc == ZNONODE) {  // no records directory yet
      rc = ensure_dir(zh, deadline);
      if (rc == ZOK || retry_after(rc)) continue;
      fail(rc, "creating " + std::string(kRecordsDir), ec);
      return {};
    }
    if (rc == ZNODEEXISTS) {
      if (mode == PutMode::always) continue;  // created meanwhile: set it
      auto got = submit_get(zh, path);
      rc = await(got, deadline);
      if (rc == ZOK) return got->value;
      if (rc == ZNONODE || retry_after(rc)) continue;  // deleted meanwhile: create again
      fail(rc, "reading record " + path, ec);
      return {};
    }
    if (retry_after(rc)) continue;
    fail(rc, "creating record " + path, ec);
    return {};
  }
  ec = make_error_code(errc::backend_unavailable);
  ec.set_detail(
      fmt::format("ZooKeeper at {}: record {} kept changing or the connection kept dropping "
                  "for {} rounds; nothing is known to be stored",
                  env_.url, path, kRounds));
  return {};
}

std::optional<std::string> Records::get(std::string_view key, Error& ec) {
  ec.clear();
  const std::string path = record_path(key);
  const Clock::time_point budget = env_.clock->now() + env_.connect_timeout + env_.command_timeout;
  std::shared_ptr<void> keep;
  int rc = kTimedOut;
  for (int round = 0; round < kRounds; ++round) {
    zhandle_t* zh = env_.session(budget, keep);
    if (zh == nullptr) {
      rc = kTimedOut;
      break;
    }
    // Read behind a sync: a lagging follower answers with the leader's record, or not at all.
    const Clock::time_point deadline = env_.clock->now() + env_.command_timeout;
    ReplyPtr got;
    rc = get_after_sync(zh, path, *env_.clock, deadline, got);
    if (rc == ZOK) rc = await(got, deadline);
    if (rc == ZOK) return std::move(got->value);
    if (rc == ZNONODE) return std::nullopt;
    if (!retry_after(rc)) break;
  }
  fail(rc, "reading record " + path, ec);
  return std::nullopt;
}

bool Records::erase(std::string_view key, Error& ec) {
  ec.clear();
  const std::string path = record_path(key);
  const Clock::time_point budget = env_.clock->now() + env_.connect_timeout + env_.command_timeout;
  std::shared_ptr<void> keep;
  bool maybe_applied = false;  // an earlier attempt may have deleted it
  int rc = kTimedOut;
  for (int round = 0; round < kRounds; ++round) {
    zhandle_t* zh = env_.session(budget, keep);
    if (zh == nullptr) {
      rc = kTimedOut;
      break;
    }
    rc = await(submit_delete(zh, path, -1), env_.clock->now() + env_.command_timeout);
    if (rc == ZOK) return true;
    if (rc == ZNONODE) return maybe_applied;
    if (!retry_after(rc)) break;
    maybe_applied = true;
  }
  fail(rc, "deleting record " + path, ec);
  return false;
}

std::vector<ListedLock> Records::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                           Error& ec) {
  ec.clear();
  truncated = false;
  std::shared_ptr<void> keep;
  zhandle_t* zh = env_.session(env_.clock->now() + env_.connect_timeout, keep);
  if (zh == nullptr) {
    fail(kTimedOut, "waiting for a connection to list held locks", ec);
    return {};
  }
  auto deadline = [&] { return env_.clock->now() + env_.command_timeout; };
  // A sync ahead of the listing, in the same round trip, as status() does: a lagging follower
  // lists what the leader has committed before the call, or does not answer.
  ReplyPtr listed;
  int rc = list_after_sync(zh, std::string(kRoot), *env_.clock, deadline(), listed);
  if (rc != ZOK) {
    fail(rc, "syncing with the leader before listing held locks", ec);
    return {};
  }
  rc = await(listed, deadline());
  if (rc == ZNONODE) return {};
  if (rc != ZOK) {
    fail(rc, "listing " + std::string(kRoot), ec);
    return {};
  }
  // (decoded name, directory) of the lock names under the prefix, sorted by name.
  std::vector<std::pair<std::string, std::string>> dirs;
  for (const auto& child : listed->children) {
    auto name = decode_component(child);  // ".records" and foreign nodes do not decode
    if (!name || !name->starts_with(prefix)) continue;
    dirs.emplace_back(std::move(*name), std::string(kRoot) + "/" + child);
  }
  std::sort(dirs.begin(), dirs.end());

  std::vector<ListedLock> out;
  // Queue of one lock → its listing (held only when somebody is queued).
  auto describe_queue = [&](const std::string& name, const std::vector<LockNode>& queue, const Stat& holder) {
    ListedLock l;
    l.name = name;
    l.info.held = true;
    l.info.token = static_cast<std::uint64_t>(holder.czxid);
    if (auto owner = owner_of_guid(queue.front().guid)) l.info.holder = *owner;
    l.info.waiters = queue.size() - 1;
    return l;  // ttl_remaining stays unknown, as in status(): the holder's session decides
  };
  for (std::size_t from = 0; from < dirs.size(); from += kListBatch) {
    const std::size_t to = std::min(dirs.size(), from + kListBatch);
    std::vector<ReplyPtr> queues;
    for (std::size_t i = from; i < to; ++i) queues.push_back(submit_children(zh, dirs[i].second));
    const auto d = deadline();
    std::vector<std::vector<LockNode>> ordered(to - from);
    std::vector<ReplyPtr> holders(to - from);
    std::vector<ReplyPtr> markers(to - from);  // the lock-delay marker, when listed
    for (std::size_t i = from; i < to; ++i) {
      rc = await(queues[i - from], d);
      if (rc == ZNONODE) continue;  // the directory went with its last node
      if (rc != ZOK) {
        fail(rc, "listing the queue " + dirs[i].second, ec);
        return {};
      }
      ordered[i - from] = queue_order(queues[i - from]->children);
      if (!ordered[i - from].empty()) {
        holders[i - from] = submit_get(zh, dirs[i].second + "/" + ordered[i - from].front().node);
        const auto& children = queues[i - from]->children;
        if (std::find(children.begin(), children.end(), std::string(kDelayNode)) != children.end())
          markers[i - from] = submit_get(zh, dirs[i].second + "/" + std::string(kDelayNode));
      }
    }
    // Whether the first node holds: not a revoked node waiting out its holder's lease, nor a
    // waiter waiting out a lost holder's lock-delay (marker: its read, or null).
    auto first_holds = [&](const ReplyPtr& first, const ReplyPtr& marker) {
      if (first->value.starts_with(kRevokedValue)) return false;
      if (!marker || await(marker, deadline()) != ZOK) return true;
      return marker_lets_first_hold(marker->value, static_cast<std::uint64_t>(first->stat.czxid));
    };
    for (std::size_t i = from; i < to; ++i) {
      if (!holders[i - from]) continue;
      rc = await(holders[i - from], deadline());
      std::optional<ListedLock> found;
      if (rc == ZOK) {
        if (first_holds(holders[i - from], markers[i - from]))
          found = describe_queue(dirs[i].first, ordered[i - from], holders[i - from]->stat);
      } else if (rc == ZNONODE) {
        // The holder left between the two reads: read this one queue again.
        for (int again = 0; again < kRecheck && !found; ++again) {
          auto q = submit_children(zh, dirs[i].second);
          rc = await(q, deadline());
          if (rc == ZNONODE) break;
          if (rc != ZOK) break;
          const auto queue = queue_order(q->children);
          if (queue.empty()) break;
          auto st = submit_get(zh, dirs[i].second + "/" + queue.front().node);
          rc = await(st, deadline());
          ReplyPtr marker;
          if (std::find(q->children.begin(), q->children.end(), std::string(kDelayNode)) != q->children.end())
            marker = submit_get(zh, dirs[i].second + "/" + std::string(kDelayNode));
          if (rc == ZOK && first_holds(st, marker)) found = describe_queue(dirs[i].first, queue, st->stat);
          if (rc == ZOK && !found) break;  // nobody holds it
          if (rc != ZOK && rc != ZNONODE) break;
        }
        if (rc == ZNONODE) rc = ZOK;
      }
      if (rc != ZOK) {
        fail(rc, "reading the holder of " + dirs[i].second, ec);
        return {};
      }
      if (!found) continue;
      if (out.size() == limit) {
        truncated = true;
        return out;
      }
      out.push_back(std::move(*found));
    }
  }
  return out;
}

}  // namespace distlock::detail::zk
