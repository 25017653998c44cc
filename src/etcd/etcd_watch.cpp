// The Watch stream shared by every waiter of a client.
#include "etcd/etcd_backend_impl.hpp"

namespace distlock::detail::etcd {

// ---- watches ---------------------------------------------------------------

std::shared_ptr<WatchStream> EtcdBackend::open_stream_locked() {
  if (stream_ && !stream_->broken) return stream_;
  if (stream_) {
    retired_.push_back(std::move(stream_));
  }
  // Join readers that have finished.
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->done) {
      (*it)->reader.join();
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
  auto s = std::make_shared<WatchStream>();
  // No real deadline: the stream lives as long as the client.
  transport_.prepare(s->ctx, std::chrono::hours(24 * 365));
  s->rw = transport_.stubs(transport_.current()).watch->Watch(&s->ctx);
  s->reader = std::thread([this, s] { reader_main(s); });
  stream_ = s;
  return s;
}

void EtcdBackend::add_watch(Entry& entry, const std::string& key, std::int64_t start_rev) {
  std::int64_t old_id = 0;
  std::int64_t id = 0;
  std::shared_ptr<WatchStream> stream;
  {
    LockGuard lk(recipe_.mutex());
    LockGuard wl(watch_mu_);
    if (stopping_) return;
    stream = open_stream_locked();
    id = next_watch_id_++;
    watches_[id] = std::static_pointer_cast<Entry>(entry.shared_from_this());
    old_id = std::exchange(entry.watch_id, id);
    entry.watch_fired = false;
  }
  if (old_id != 0) cancel_watch(old_id);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(key);
  create->set_start_revision(start_rev);
  create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  create->set_watch_id(id);
  std::lock_guard wl(stream->write_mu);
  transport_.count_exchange();  // the create, answered on the stream
  if (!stream->rw->Write(req)) {
    // The reader sees the break and wakes every waiter, this one included.
    log_.log(LogLevel::debug, "etcd watch stream write failed");
  }
}

void EtcdBackend::cancel_watch(std::int64_t watch_id) noexcept {
  std::shared_ptr<WatchStream> stream;
  {
    LockGuard wl(watch_mu_);
    if (watches_.erase(watch_id) == 0) return;
    stream = stream_;
  }
  if (!stream || stream->broken) return;
  try {
    etcdserverpb::WatchRequest req;
    req.mutable_cancel_request()->set_watch_id(watch_id);
    std::lock_guard wl(stream->write_mu);
    transport_.count_exchange();  // the cancel, answered on the stream
    stream->rw->Write(req);
  } catch (...) {
  }
}

void EtcdBackend::reader_main(std::shared_ptr<WatchStream> stream) {
  etcdserverpb::WatchResponse resp;
  auto fire = [&](std::int64_t watch_id) {
    std::shared_ptr<Entry> entry;
    {
      LockGuard wl(watch_mu_);
      auto it = watches_.find(watch_id);
      if (it == watches_.end()) return;
      entry = it->second.lock();
      watches_.erase(it);
    }
    if (!entry) return;
    {
      LockGuard lk(recipe_.mutex());
      // A watch replaced or cancelled since (the entry forgotten) says nothing.
      if (entry->watch_id != watch_id) return;
      entry->watch_fired = true;
      entry->watch_id = 0;
    }
    if (ChangeListener* l = recipe_.listener()) l->on_change(entry->name);
  };
  while (stream->rw->Read(&resp)) {
    if (resp.canceled()) {
      // Compacted (the revision it was to start from is gone: ErrCompacted), or cancelled by
      // the server: the waiter reads its predecessor again and watches from that read.
      if (resp.compact_revision() > 0) {
        log_.log(LogLevel::info,
                 "etcd cancelled a waiter's watch: its start revision was compacted (up to {}); it "
                 "looks again",
                 resp.compact_revision());
      }
      fire(resp.watch_id());
      continue;
    }
    for (const auto& ev : resp.events()) {
      if (ev.type() == mvccpb::Event::DELETE) {
        fire(resp.watch_id());
        std::lock_guard wl(stream->write_mu);
        etcdserverpb::WatchRequest cancel;
        cancel.mutable_cancel_request()->set_watch_id(resp.watch_id());
        stream->rw->Write(cancel);
        break;
      }
    }
  }
  const grpc::Status st = stream->rw->Finish();
  std::vector<std::int64_t> ids;
  {
    LockGuard wl(watch_mu_);
    stream->broken = true;
    if (stopping_) {
      stream->done = true;
      return;
    }
    if (stream_ == stream) transport_.advance(transport_.current());
    for (auto& [id, k] : watches_) ids.push_back(id);
  }
  log_.log(LogLevel::info, "etcd watch stream ended ({}); waiters re-check", st.error_message());
  if (etcd::Transport::invalid_token(st) && transport_.has_auth()) {
    (void)transport_.authenticate();
  }
  // Do not spin if the stream breaks at once again.
  std::this_thread::sleep_for(Millis(50));
  for (auto id : ids) fire(id);
  stream->done = true;
}

}  // namespace distlock::detail::etcd
