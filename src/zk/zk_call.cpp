#include "zk/zk_call.hpp"

#include <cstring>

namespace distlock::detail::zk {

namespace {

SessionContext* context_of(zhandle_t* zh) {
  // zookeeper_init2 was given a mutable SessionContext*; the C client hands it back as const.
  return static_cast<SessionContext*>(const_cast<void*>(zoo_get_context(zh)));
}

// The C client carries `const void* data` to the completion: a heap copy of the
// shared_ptr, released by the completion (or at once when submission fails).
// Every submit_* passes here once: the request is counted and in flight (SessionContext).
const void* hand_over(zhandle_t* zh, const ReplyPtr& r) {
  if (SessionContext* c = context_of(zh)) {
    if (c->round_trips != nullptr) c->round_trips->add();
    c->in_flight.started();
    r->session = c;
  }
  return new ReplyPtr(r);
}

// A completion's hold on its reply, taken back from `data`. When it goes (the completion
// returns, after any request the completion itself submitted), the request is no longer
// in flight: the session may be closed from then on.
class Taken {
 public:
  explicit Taken(const void* data) {
    auto* holder = static_cast<const ReplyPtr*>(data);
    reply_ = *holder;
    delete holder;
  }
  ~Taken() {
    if (reply_->session != nullptr) reply_->session->in_flight.finished();
  }
  Taken(const Taken&) = delete;
  Taken& operator=(const Taken&) = delete;

  Reply* operator->() const noexcept { return reply_.get(); }
  Reply& operator*() const noexcept { return *reply_; }
  const ReplyPtr& reply() const noexcept { return reply_; }

 private:
  ReplyPtr reply_;
};

void complete(Reply& r, int rc) {
  LockGuard lk(r.mu);
  r.rc = rc;
  r.done = true;
  r.cv.notify_all();
}

// Submission refused by the client (bad state, bad arguments): no completion will run.
ReplyPtr refused(const void* data, int rc) {
  Taken r(data);
  complete(*r, rc);
  return r.reply();
}

void on_void(int rc, const void* data) {
  Taken r(data);
  complete(*r, rc);
}

void on_stat(int rc, const Stat* stat, const void* data) {
  Taken r(data);
  if (rc == ZOK && stat != nullptr) r->stat = *stat;
  complete(*r, rc);
}

void on_strings(int rc, const String_vector* v, const void* data) {
  Taken r(data);
  if (rc == ZOK && v != nullptr) {
    r->children.reserve(static_cast<std::size_t>(v->count));
    for (int i = 0; i < v->count; ++i) r->children.emplace_back(v->data[i]);
  }
  complete(*r, rc);
}

void on_strings_stat(int rc, const String_vector* v, const Stat* stat, const void* data) {
  Taken r(data);
  if (rc == ZOK && v != nullptr) {
    r->children.reserve(static_cast<std::size_t>(v->count));
    for (int i = 0; i < v->count; ++i) r->children.emplace_back(v->data[i]);
  }
  if (rc == ZOK && stat != nullptr) r->stat = *stat;
  complete(*r, rc);
}

void on_data(int rc, const char* value, int len, const Stat* stat, const void* data) {
  Taken r(data);
  if (rc == ZOK) {
    if (value != nullptr && len > 0) r->value.assign(value, static_cast<std::size_t>(len));
    if (stat != nullptr) r->stat = *stat;
  }
  complete(*r, rc);
}

void on_string(int rc, const char*, const void* data) {
  Taken r(data);
  complete(*r, rc);
}

void on_string_stat(int rc, const char* value, const Stat* stat, const void* data) {
  Taken r(data);
  if (rc == ZOK) {
    if (value != nullptr) r->value = value;
    if (stat != nullptr) r->stat = *stat;
  }
  bool undo = false;
  {
    LockGuard lk(r->mu);
    r->rc = rc;
    r->done = true;
    undo = rc == ZOK && r->abandoned && r->undo_if_abandoned && !r->value.empty();
    r->cv.notify_all();
  }
  // Nobody waits for this node any more: it would sit in the queue (or hold the lock)
  // until the session ends. Delete it; an async call is allowed on this thread.
  if (undo) submit_delete(r->zh, r->value, -1);
}

void on_multi(int rc, const void* data) {
  Taken r(data);
  if (rc == ZOK) {
    r->value = r->path_buffer.data();
    r->stat = r->parent_stat;
  }
  bool undo = false;
  {
    LockGuard lk(r->mu);
    r->rc = rc;
    r->done = true;
    undo = rc == ZOK && r->abandoned && r->undo_if_abandoned && !r->value.empty();
    r->cv.notify_all();
  }
  if (undo) submit_delete(r->zh, r->value, -1);
}

// A multi without a create: nothing to undo, no path.
void on_multi_plain(int rc, const void* data) {
  Taken r(data);
  LockGuard lk(r->mu);
  r->rc = rc;
  r->done = true;
  r->cv.notify_all();
}

}  // namespace

ReplyPtr submit_set_both(zhandle_t* zh, const std::string& path1, std::string_view data1, int version1,
                         const std::string& path2, std::string_view data2, int version2) {
  auto r = std::make_shared<Reply>();
  zoo_op_t ops[2];
  zoo_set_op_init(&ops[0], path1.c_str(), data1.data(), static_cast<int>(data1.size()), version1, &r->stat);
  zoo_set_op_init(&ops[1], path2.c_str(), data2.data(), static_cast<int>(data2.size()), version2,
                  &r->parent_stat);
  const void* d = hand_over(zh, r);
  const int rc = zoo_amulti(zh, 2, ops, r->results, &on_multi_plain, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_delete_both(zhandle_t* zh, const std::string& path1, int version1, const std::string& path2,
                            int version2) {
  auto r = std::make_shared<Reply>();
  zoo_op_t ops[2];
  zoo_delete_op_init(&ops[0], path1.c_str(), version1);
  zoo_delete_op_init(&ops[1], path2.c_str(), version2);
  const void* d = hand_over(zh, r);
  const int rc = zoo_amulti(zh, 2, ops, r->results, &on_multi_plain, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_create_and_touch(zhandle_t* zh, const std::string& path, std::string_view data,
                                 const ACL_vector* acl, int mode, const std::string& parent) {
  auto r = std::make_shared<Reply>();
  r->zh = zh;
  r->undo_if_abandoned = true;
  // Room for the path, the sequence suffix and a chroot prefix.
  r->path_buffer.assign(path.size() + 4096, '\0');
  zoo_op_t ops[2];
  zoo_create_op_init(&ops[0], path.c_str(), data.data(), static_cast<int>(data.size()), acl, mode,
                     r->path_buffer.data(), static_cast<int>(r->path_buffer.size()));
  zoo_set_op_init(&ops[1], parent.c_str(), nullptr, -1, -1, &r->parent_stat);
  const void* d = hand_over(zh, r);
  const int rc = zoo_amulti(zh, 2, ops, r->results, &on_multi, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_create(zhandle_t* zh, const std::string& path, std::string_view data, const ACL_vector* acl,
                       int mode) {
  auto r = std::make_shared<Reply>();
  r->zh = zh;
  r->undo_if_abandoned = true;
  const void* d = hand_over(zh, r);
  const int rc = zoo_acreate2(zh, path.c_str(), data.data(), static_cast<int>(data.size()), acl, mode,
                              &on_string_stat, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_delete(zhandle_t* zh, const std::string& path, int version) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_adelete(zh, path.c_str(), version, &on_void, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_exists(zhandle_t* zh, const std::string& path, watcher_fn watcher, void* watcher_ctx) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = watcher != nullptr ? zoo_awexists(zh, path.c_str(), watcher, watcher_ctx, &on_stat, d)
                                    : zoo_aexists(zh, path.c_str(), 0, &on_stat, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_children(zhandle_t* zh, const std::string& path) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_aget_children(zh, path.c_str(), 0, &on_strings, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_children_stat(zhandle_t* zh, const std::string& path, bool watch) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_aget_children2(zh, path.c_str(), watch ? 1 : 0, &on_strings_stat, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_get_watched(zhandle_t* zh, const std::string& path) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_aget(zh, path.c_str(), 1, &on_data, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_get(zhandle_t* zh, const std::string& path) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_aget(zh, path.c_str(), 0, &on_data, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_get(zhandle_t* zh, const std::string& path, watcher_fn watcher, void* watcher_ctx) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_awget(zh, path.c_str(), watcher, watcher_ctx, &on_data, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_set(zhandle_t* zh, const std::string& path, std::string_view data, int version) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_aset(zh, path.c_str(), data.data(), static_cast<int>(data.size()), version, &on_stat, d);
  return rc == ZOK ? r : refused(d, rc);
}

ReplyPtr submit_sync(zhandle_t* zh, const std::string& path) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc = zoo_async(zh, path.c_str(), &on_string, d);
  return rc == ZOK ? r : refused(d, rc);
}

namespace {
// A sync, `read` pipelined behind it (its reply in `out`), the sync awaited.
template <typename Read>
int read_after_sync(zhandle_t* zh, Clock& clock, Clock::time_point deadline, Read read, ReplyPtr& out) {
  const ReplyPtr synced = submit_sync(zh, "/");  // "/" (the chroot) always exists
  out = read();
  return await(synced, clock, deadline);
}
}  // namespace

int list_after_sync(zhandle_t* zh, const std::string& path, Clock& clock, Clock::time_point deadline,
                    ReplyPtr& listed) {
  return read_after_sync(
      zh, clock, deadline, [&] { return submit_children(zh, path); }, listed);
}

int get_after_sync(zhandle_t* zh, const std::string& path, Clock& clock, Clock::time_point deadline,
                   ReplyPtr& got) {
  return read_after_sync(
      zh, clock, deadline, [&] { return submit_get(zh, path); }, got);
}

ReplyPtr submit_auth(zhandle_t* zh, const std::string& credentials) {
  auto r = std::make_shared<Reply>();
  const void* d = hand_over(zh, r);
  const int rc =
      zoo_add_auth(zh, "digest", credentials.data(), static_cast<int>(credentials.size()), &on_void, d);
  return rc == ZOK ? r : refused(d, rc);
}

int await(const ReplyPtr& reply, Clock& clock, Clock::time_point deadline) {
  UniqueLock lk(reply->mu);
  // Clock::wait_until may return early (spuriously, or to let a manual clock be
  // observed): loop on the clock's own reading.
  while (!reply->done && clock.now() < deadline) clock.wait_until(reply->cv, lk.native(), deadline);
  if (!reply->done) {
    reply->abandoned = true;
    return kTimedOut;
  }
  return reply->rc;
}

void close_session(zhandle_t* zh) noexcept {
  if (zh == nullptr) return;
  if (SessionContext* c = context_of(zh)) c->in_flight.drain(kCloseDrain);
  zookeeper_close(zh);
}

bool is_transient(int rc) noexcept {
  return rc == kTimedOut || rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONEXPIRED ||
         rc == ZINVALIDSTATE || rc == ZCLOSING || rc == ZSESSIONMOVED || rc == ZTHROTTLEDOP ||
         rc == ZNOTREADONLY;
}

std::string describe(int rc) {
  if (rc == kTimedOut) return "no answer before the command timeout";
  const char* text = zerror(rc);
  return std::string(text != nullptr ? text : "unknown error") + " (ZooKeeper code " + std::to_string(rc) +
         ")";
}

}  // namespace distlock::detail::zk
