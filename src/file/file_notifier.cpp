// Waiting on file locks: inotify watches on lock files (reference counted, idle ones
// kept) and the notifier thread that wakes waiters and reports lost leases.
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "file/file_backend_impl.hpp"

namespace distlock::detail::file {

namespace {

// Watches on lock files. A held (or recently held) file is watched for anything
// that could mean it is gone, so a removal is reported as a loss; a file somebody
// waits for also for closes (a holder released or died; also every opener that did
// not lock). Held files are not watched for closes: our own release would wake the
// notifier thread on every cycle.
constexpr std::uint32_t kGoneWatch = IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF | IN_DONT_FOLLOW;
constexpr std::uint32_t kWaitWatch = kGoneWatch | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE;
constexpr std::uint32_t kGoneMask = IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF | IN_IGNORED;
// Watches of files nobody holds or waits for any more are kept (up to this many per
// client, least recently used dropped first), so taking the same lock again costs
// no inotify call.
constexpr std::size_t kMaxIdleWatches = 1024;

// The kernel posts the close event of a dying holder's descriptor a moment before it
// drops that descriptor's locks (fsnotify_close precedes locks_remove_file in
// __fput), so a waiter woken by the event can still find the lock taken. When a close
// event finds the lock held, the notifier looks again after these delays; after the
// last one it waits for the next event (and the engine's fallback re-check).
constexpr std::array<std::chrono::milliseconds, 2> kConfirmDelays = {std::chrono::milliseconds(5),
                                                                     std::chrono::milliseconds(50)};

}  // namespace

void FileBackend::watch(std::string_view name, Error& ec) {
  ec.clear();
  LockGuard lk(mu_);
  add_watch_ref(lock_file_name(name, name_max_), name, /*wait=*/true);
}

void FileBackend::unwatch(std::string_view name) noexcept {
  try {
    LockGuard lk(mu_);
    drop_watch_ref(lock_file_name(name, name_max_), /*wait=*/true);
  } catch (...) {  // lock_file_name allocates; nothing to undo if it fails
  }
}

// Caller holds mu_. Points the file's watch at `mask` (no call when it already is).
void FileBackend::set_watch_mask(const std::string& fname, FileWatch& w, std::uint32_t mask) {
  if (!inotify_fd_ || (w.wd >= 0 && w.mask == mask)) return;
  const int wd = ::inotify_add_watch(inotify_fd_.get(), path_of(fname).c_str(), mask);
  if (wd < 0) {
    const int err = errno;
    if (!warned_watch_limit_) {
      warned_watch_limit_ = true;
      log_.log(LogLevel::warning,
               "file backend {}: cannot watch {} ({}); waiters fall back to re-checking every {} ms", url_,
               path_of(fname), errno_text(err), settings_.recheck.count());
    }
    return;
  }
  if (w.wd >= 0 && wd != w.wd) {  // the path names another inode now: watch that one only
    ::inotify_rm_watch(inotify_fd_.get(), w.wd);
    by_wd_.erase(w.wd);
  }
  w.wd = wd;
  w.mask = mask;
  by_wd_[wd] = fname;
}

// Caller holds mu_.
void FileBackend::add_watch_ref(const std::string& fname, std::string_view name, bool wait) {
  FileWatch& w = watches_[fname];
  if (w.idle) {
    idle_.erase(w.idle_pos);
    w.idle = false;
  }
  if (w.wait_refs == 0 && w.hold_refs == 0) w.name = std::string(name);
  (wait ? w.wait_refs : w.hold_refs) += 1;
  if (wait && !w.check_fd) {
    w.check_fd =
        Fd(::openat(dir_fd_.get(), fname.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, file_mode_));
    // An untrusted file is never looked at; the waiter's own attempts report it.
    if (w.check_fd && !untrusted(w.check_fd.get(), fname).empty()) w.check_fd.reset();
  }
  set_watch_mask(fname, w, w.wait_refs > 0 ? kWaitWatch : kGoneWatch);
}

// Caller holds mu_.
void FileBackend::drop_watch_ref(const std::string& fname, bool wait) {
  auto it = watches_.find(fname);
  if (it == watches_.end()) return;
  FileWatch& w = it->second;
  int& refs = wait ? w.wait_refs : w.hold_refs;
  if (refs > 0) --refs;
  if (w.wait_refs == 0) {
    // Closing the check descriptor posts a close event to other waiters; they
    // see the lock state unchanged and stay asleep.
    w.check_fd.reset();
    w.confirm_at.reset();
    if (w.wd >= 0) set_watch_mask(fname, w, kGoneWatch);
  }
  if (w.wait_refs > 0 || w.hold_refs > 0) return;
  if (w.wd < 0) {
    watches_.erase(it);
    return;
  }
  w.idle = true;
  w.idle_pos = idle_.insert(idle_.end(), fname);
  if (idle_.size() > kMaxIdleWatches) {
    auto oldest = watches_.find(idle_.front());
    idle_.pop_front();
    if (oldest != watches_.end()) {
      ::inotify_rm_watch(inotify_fd_.get(), oldest->second.wd);
      by_wd_.erase(oldest->second.wd);
      watches_.erase(oldest);
    }
  }
}

void FileBackend::notifier_main() {
  alignas(struct inotify_event) std::array<char, 16384> buf{};
  for (;;) {
    int timeout_ms = -1;
    {
      LockGuard lk(mu_);
      const auto now = SteadyClock::now();
      for (auto& [fname, w] : watches_) {
        if (!w.confirm_at) continue;
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*w.confirm_at - now).count();
        const int wait = static_cast<int>(std::max<std::int64_t>(0, ms));
        timeout_ms = timeout_ms < 0 ? wait : std::min(timeout_ms, wait);
      }
    }
    std::array<pollfd, 2> fds{pollfd{inotify_fd_.get(), POLLIN, 0}, pollfd{notifier_.wake_fd(), POLLIN, 0}};
    const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) {
      log_.log(LogLevel::error, "file backend {}: poll failed ({}); notifications stop", url_,
               errno_text(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // only the destructor wakes us: stop

    Actions actions;
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const ssize_t n = ::read(inotify_fd_.get(), buf.data(), buf.size());
        if (n <= 0) break;
        LockGuard lk(mu_);
        for (ssize_t off = 0; off < n;) {
          const auto* ev = reinterpret_cast<const struct inotify_event*>(buf.data() + off);
          handle_event(*ev, actions);
          off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
        }
      }
    }
    {
      LockGuard lk(mu_);
      run_due_confirms(actions);
    }
    deliver(actions);
  }
}

// Caller holds mu_.
void FileBackend::handle_event(const struct inotify_event& ev, Actions& actions) {
  if (ev.mask & IN_Q_OVERFLOW) {
    // Events were dropped: wake every waiter and re-check every held file.
    std::vector<std::string> fnames;
    for (const auto& [fname, w] : watches_) fnames.push_back(fname);
    for (const auto& fname : fnames) {  // on_file_event may erase entries
      auto w = watches_.find(fname);
      if (w != watches_.end()) on_file_event(fname, w->second, IN_CLOSE_WRITE | IN_ATTRIB, actions);
    }
    return;
  }
  auto it = by_wd_.find(ev.wd);
  if (it == by_wd_.end()) return;  // a watch we removed
  const std::string fname = it->second;
  auto w = watches_.find(fname);
  if (w == watches_.end()) return;
  if (ev.mask & IN_IGNORED) {  // the kernel dropped the watch (file freed)
    by_wd_.erase(it);
    w->second.wd = -1;
    w->second.mask = 0;
    if (w->second.idle) {
      idle_.erase(w->second.idle_pos);
      watches_.erase(w);
      return;
    }
  }
  on_file_event(fname, w->second, ev.mask, actions);
}

// Caller holds mu_.
void FileBackend::on_file_event(const std::string& fname, FileWatch& w, std::uint32_t mask,
                                Actions& actions) {
  if ((mask & (IN_CLOSE_WRITE | IN_CLOSE_NOWRITE)) && w.wait_refs > 0) {
    // Every opener posts a close event, most of them failed attempts by other
    // waiters: wake our waiters only when the lock is actually free, so attempts
    // do not wake each other in a loop.
    if (!w.check_fd || !locked_by_someone(w.check_fd.get())) {
      actions.changed.push_back(w.name);
      w.confirm_at.reset();
    } else if (!w.confirm_at) {
      w.confirm_stage = 0;
      w.confirm_at = SteadyClock::now() + kConfirmDelays[0];
    }
  }
  if (mask & kGoneMask) {
    if (w.wait_refs > 0) actions.changed.push_back(w.name);  // waiters retry on a fresh file
    // A held file that is no longer at its path: the lease is lost. The engine
    // will not call release() for a lost lease, so its descriptor goes now.
    const std::string name = w.name;  // `w` may be erased below
    const std::string prefix = held_key(name, "");
    for (auto h = held_.lower_bound(prefix); h != held_.end() && h->first.starts_with(prefix);) {
      if (h->second.fname == fname && !still_linked(h->second)) {
        actions.lost.emplace_back(name, h->first.substr(prefix.size()));
        h = held_.erase(h);
        drop_watch_ref(fname, /*wait=*/false);
      } else {
        ++h;
      }
    }
  }
}

// Caller holds mu_.
void FileBackend::run_due_confirms(Actions& actions) {
  const auto now = SteadyClock::now();
  for (auto& [fname, w] : watches_) {
    if (!w.confirm_at || *w.confirm_at > now) continue;
    if (!w.check_fd || !locked_by_someone(w.check_fd.get())) {
      actions.changed.push_back(w.name);
      w.confirm_at.reset();
    } else if (++w.confirm_stage < kConfirmDelays.size()) {
      w.confirm_at = now + kConfirmDelays[w.confirm_stage];
    } else {
      w.confirm_at.reset();
    }
  }
}

void FileBackend::deliver(Actions& actions) {
  ChangeListener* listener = listener_.load(std::memory_order_acquire);
  if (!listener) return;
  std::sort(actions.changed.begin(), actions.changed.end());
  actions.changed.erase(std::unique(actions.changed.begin(), actions.changed.end()), actions.changed.end());
  for (const auto& name : actions.changed) listener->on_change(name);
  for (const auto& [name, owner] : actions.lost) {
    log_.log(LogLevel::warning, "file backend: the lock file of \"{}\" was removed or replaced while held",
             printable(name));
    listener->on_lease_lost(name, owner);
  }
}

}  // namespace distlock::detail::file
