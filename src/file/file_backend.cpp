#include "file/file_backend.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.hpp"
#include "core/owner_id.hpp"
#include "core/url_keys.hpp"
#include "core/worker_loop.hpp"
#include "file/file_common.hpp"
#include "file/file_records.hpp"

namespace distlock::detail {

namespace {

using namespace file_io;
using SteadyClock = std::chrono::steady_clock;

std::string sha256_hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha256(), nullptr) != 1) {
    throw std::system_error(make_error_code(errc::protocol_error), "SHA-256 of a lock name failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 0xf]);
  }
  return out;
}

bool is_unreserved(unsigned char c, bool first) {
  if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return true;
  if (c == '_' || c == '-') return true;
  return c == '.' && !first;  // a leading '.' would make a hidden file
}

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

struct Settings {
  std::string dir;
  Millis recheck{std::chrono::seconds(1)};
  bool sync = false;
};

class FileBackend final : public RecordsBackend<FileRecords> {
 public:
  FileBackend(Settings settings, Fd dir_fd, std::size_t name_max, mode_t file_mode, std::string url,
              const ClientOptions& opts)
      : settings_(std::move(settings)),
        dir_fd_(std::move(dir_fd)),
        name_max_(name_max),
        file_mode_(file_mode),
        url_(std::move(url)),
        log_(opts.logger),
        records_(dir_fd_.get(), settings_.dir, name_max_, log_) {
    inotify_fd_ = Fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    int err = errno;
    if (!notifier_.valid()) err = notifier_.error();
    if (!inotify_fd_ || !notifier_.valid()) {
      // Without inotify (e.g. fs.inotify.max_user_instances reached) waiters still
      // progress through the engine's fallback re-check every `recheck`.
      log_.log(LogLevel::warning,
               "file backend {}: inotify unavailable ({}); waiters fall back to re-checking every {} ms",
               url_, errno_text(err), settings_.recheck.count());
      inotify_fd_.reset();
      return;
    }
    notifier_.start([this] { notifier_main(); });
  }

  ~FileBackend() override {
    notifier_.stop();
    // Any lock still held (the engine releases its leases first) is dropped by closing.
    std::lock_guard lk(mu_);
    held_.clear();
    watches_.clear();
  }

  Capabilities capabilities() const noexcept override { return {true, false}; }
  void set_listener(ChangeListener* l) override { listener_.store(l, std::memory_order_release); }

  AcquireResult try_acquire(const AcquireRequest& req, std::error_code& ec) override {
    ec.clear();
    const std::string fname = lock_file_name(req.name, name_max_);
    // A lock file removed or replaced from outside between our open and our lock
    // would leave us locking an orphan: re-open and try again a few times.
    for (int attempt = 0; attempt < 4; ++attempt) {
      Fd fd(::openat(dir_fd_.get(), fname.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, file_mode_));
      if (!fd) {
        const int err = errno;
        return fail(ec, errc::backend_unavailable, "cannot open lock file " + path_of(fname), err);
      }
      if (std::string problem = untrusted(fd.get(), fname); !problem.empty()) {
        return fail(ec, errc::backend_unavailable, problem, 0);
      }
      struct flock fl = whole_file(F_WRLCK);
      if (::fcntl(fd.get(), F_OFD_SETLK, &fl) != 0) {
        if (errno == EAGAIN || errno == EACCES) {
          AcquireResult busy;
          busy.holder_ttl = settings_.recheck;  // no TTL here: bounds the engine's fallback re-check
          return busy;
        }
        const int err = errno;
        return fail(ec, errc::backend_unavailable, "cannot lock " + path_of(fname), err);
      }
      struct stat ours {
      }, at_path{};
      if (::fstat(fd.get(), &ours) != 0 ||
          ::fstatat(dir_fd_.get(), fname.c_str(), &at_path, AT_SYMLINK_NOFOLLOW) != 0 || ours.st_nlink == 0 ||
          !same_inode(ours, at_path)) {
        continue;  // closing fd drops the lock on the orphan
      }
      Record rec;
      std::string why;
      if ((ec = read_record(fd.get(), rec, why))) {
        log_.log(LogLevel::error, "file backend: lock file {} of lock \"{}\": {}", path_of(fname),
                 printable(req.name), why);
        return {};
      }
      if (rec.present && rec.name != req.name) {
        // A SHA-256 collision, or a file written by something else: never take it over.
        return fail(
            ec, errc::protocol_error,
            "lock file " + path_of(fname) + " belongs to another lock name \"" + printable(rec.name) + "\"",
            0);
      }
      if (rec.token == std::numeric_limits<std::uint64_t>::max()) {
        // The next token would wrap to 0, below every token issued before: never.
        return fail(ec, errc::exhausted,
                    "lock file " + path_of(fname) + " of lock \"" + printable(req.name) +
                        "\" holds the largest fencing token (" + std::to_string(rec.token) +
                        "), so no greater one can be issued (a forged or damaged record?); the file is kept "
                        "as it is",
                    0);
      }
      const bool first_use = !rec.present;
      rec.present = true;
      rec.token += 1;
      rec.pid = ::getpid();
      rec.acquired_unix_ms =
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count());
      rec.owner = std::string(req.owner);
      rec.name = std::string(req.name);
      const std::string bytes = encode_record(rec);
      const ssize_t n = ::pwrite(fd.get(), bytes.data(), bytes.size(), 0);
      if (n != static_cast<ssize_t>(bytes.size())) {
        return fail(ec, errc::backend_unavailable, "cannot write the fencing token to " + path_of(fname),
                    n < 0 ? errno : ENOSPC);
      }
      if (settings_.sync) {
        // The token must not go back after a power loss: sync the file, and the
        // directory entry of a file this acquisition may have created.
        if (::fdatasync(fd.get()) != 0 || (first_use && ::fsync(dir_fd_.get()) != 0)) {
          const int err = errno;
          return fail(ec, errc::backend_unavailable, "cannot sync " + path_of(fname), err);
        }
      }

      HeldFile held;
      held.fname = fname;
      held.fd = std::move(fd);
      held.token = rec.token;
      held.inode = ours;
      std::lock_guard lk(mu_);
      // Watch the held file too, so a removal from outside is reported as a loss.
      add_watch_ref(fname, req.name, /*wait=*/false);
      auto [it, inserted] = held_.try_emplace(held_key(req.name, req.owner));
      if (!inserted) drop_watch_ref(it->second.fname, false);  // a lost lease of this owner: replaced
      it->second = std::move(held);
      return AcquireResult{true, rec.token, Millis(0), std::nullopt};
    }
    return fail(ec, errc::backend_unavailable,
                "lock file " + path_of(fname) + " keeps being removed or replaced while we lock it", 0);
  }

  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, std::error_code& ec) override {
    ec.clear();
    std::lock_guard lk(mu_);
    for (std::size_t i = 0; i < items.size(); ++i) {
      auto it = held_.find(held_key(items[i].name, items[i].owner));
      const bool ours = it != held_.end() && it->second.token == items[i].token && still_linked(it->second);
      out[i] = ours ? RenewStatus::renewed : RenewStatus::not_owner;
    }
  }

  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        std::error_code& ec) override {
    ec.clear();
    HeldFile held;
    {
      std::lock_guard lk(mu_);
      auto it = held_.find(held_key(name, owner));
      if (it == held_.end() || it->second.token != token) return ReleaseStatus::not_owner;
      held = std::move(it->second);
      held_.erase(it);
      drop_watch_ref(held.fname, false);
    }
    const bool linked = still_linked(held);
    // Unlock before closing: the close event that wakes other waiters then always
    // comes after the lock is free. Nothing is written or removed.
    struct flock fl = whole_file(F_UNLCK);
    (void)::fcntl(held.fd.get(), F_OFD_SETLK, &fl);
    held.fd.reset();
    // A file removed from outside while we held it: another process may have
    // created a new one and locked it, so our lease was not exclusive any more.
    return linked ? ReleaseStatus::released : ReleaseStatus::not_owner;
  }

  void watch(std::string_view name, std::error_code& ec) override {
    ec.clear();
    std::lock_guard lk(mu_);
    add_watch_ref(lock_file_name(name, name_max_), name, /*wait=*/true);
  }

  void unwatch(std::string_view name) noexcept override {
    try {
      std::lock_guard lk(mu_);
      drop_watch_ref(lock_file_name(name, name_max_), /*wait=*/true);
    } catch (...) {  // lock_file_name allocates; nothing to undo if it fails
    }
  }

  LockInfo status(std::string_view name, std::error_code& ec) override {
    ec.clear();
    const std::string fname = lock_file_name(name, name_max_);
    LockInfo info;
    Fd fd(::openat(dir_fd_.get(), fname.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) {
      if (errno == ENOENT) {
        info.token = 0;  // never taken here
        return info;
      }
      const int err = errno;
      fail(ec, errc::backend_unavailable, "cannot open lock file " + path_of(fname), err);
      return {};
    }
    if (std::string problem = untrusted(fd.get(), fname); !problem.empty()) {
      fail(ec, errc::backend_unavailable, problem, 0);
      return {};
    }
    info.held = locked_by_someone(fd.get());
    // Read without the lock: a holder may be writing its record right now, so a
    // damaged read is retried before it counts as corruption.
    Record rec;
    std::string why;
    for (int i = 0; i < 3; ++i) {
      if (!(ec = read_record(fd.get(), rec, why))) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (ec) {
      log_.log(LogLevel::error, "file backend: lock file {}: {}", path_of(fname), why);
      return {};
    }
    return lock_info_of(info.held, rec);
  }

  // Records and listing (RecordsBackend forwards them): file_records.cpp.
  FileRecords& records() noexcept override { return records_; }

  std::string url() const override { return url_; }

 private:
  struct HeldFile {
    std::string fname;
    Fd fd;  // the open file description that owns the OFD lock
    std::uint64_t token = 0;
    struct stat inode {};
  };

  struct FileWatch {
    std::string name;        // the lock name, for on_change
    int wd = -1;             // inotify watch descriptor, -1 when none
    Fd check_fd;             // read-only descriptor for F_OFD_GETLK while anyone waits
    std::uint32_t mask = 0;  // events the watch asks for
    int wait_refs = 0;
    int hold_refs = 0;
    bool idle = false;  // nobody holds or waits: the entry is in idle_ at idle_pos
    std::list<std::string>::iterator idle_pos;
    std::size_t confirm_stage = 0;  // index into kConfirmDelays of the pending look
    std::optional<SteadyClock::time_point> confirm_at;
  };

  static std::string held_key(std::string_view name, std::string_view owner) {
    std::string key(name);
    key.push_back('\0');
    key.append(owner);
    return key;
  }

  std::string path_of(const std::string& fname) const {
    return settings_.dir == "/" ? "/" + fname : settings_.dir + "/" + fname;
  }

  /// "" when the open lock file may be used, else a message naming it and its problem.
  std::string untrusted(int fd, const std::string& fname) const {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return "cannot stat lock file " + path_of(fname) + ": " + errno_text(errno);
    std::string problem = trust_problem(st, /*directory=*/false, /*sticky_ok=*/false);
    if (problem.empty()) return problem;
    return "lock file " + path_of(fname) + " " + problem +
           ": another user could unlock it or forge its token; it is not used (remove it, or chown it to "
           "yourself, when no process uses it)";
  }

  AcquireResult fail(std::error_code& ec, errc code, const std::string& what, int err) {
    ec = make_error_code(code);
    log_.log(LogLevel::error, "file backend: {}{}{}", what, err ? ": " : "", err ? errno_text(err) : "");
    return {};
  }

  /// The held descriptor's file is still the one at its path (not removed or replaced).
  bool still_linked(const HeldFile& h) const {
    struct stat ours {
    }, at_path{};
    if (::fstat(h.fd.get(), &ours) != 0 || ours.st_nlink == 0) return false;
    if (::fstatat(dir_fd_.get(), h.fname.c_str(), &at_path, AT_SYMLINK_NOFOLLOW) != 0) return false;
    return same_inode(ours, at_path);
  }

  // Caller holds mu_. Points the file's watch at `mask` (no call when it already is).
  void set_watch_mask(const std::string& fname, FileWatch& w, std::uint32_t mask) {
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
  void add_watch_ref(const std::string& fname, std::string_view name, bool wait) {
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
  void drop_watch_ref(const std::string& fname, bool wait) {
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

  // ---- The notifier thread: one per client, shared by every wait. ----

  struct Actions {
    std::vector<std::string> changed;                       // lock names that may be free
    std::vector<std::pair<std::string, std::string>> lost;  // (name, owner) whose file went away
  };

  void notifier_main() {
    alignas(struct inotify_event) std::array<char, 16384> buf{};
    for (;;) {
      int timeout_ms = -1;
      {
        std::lock_guard lk(mu_);
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
          std::lock_guard lk(mu_);
          for (ssize_t off = 0; off < n;) {
            const auto* ev = reinterpret_cast<const struct inotify_event*>(buf.data() + off);
            handle_event(*ev, actions);
            off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
          }
        }
      }
      {
        std::lock_guard lk(mu_);
        run_due_confirms(actions);
      }
      deliver(actions);
    }
  }

  // Caller holds mu_.
  void handle_event(const struct inotify_event& ev, Actions& actions) {
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
  void on_file_event(const std::string& fname, FileWatch& w, std::uint32_t mask, Actions& actions) {
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
  void run_due_confirms(Actions& actions) {
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

  void deliver(Actions& actions) {
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

  const Settings settings_;
  const Fd dir_fd_;
  const std::size_t name_max_;
  const mode_t file_mode_;
  const std::string url_;
  Logger log_;
  FileRecords records_;
  std::atomic<ChangeListener*> listener_{nullptr};  // set once, before any watch

  Fd inotify_fd_;

  std::mutex mu_;
  std::map<std::string, HeldFile, std::less<>> held_;  // key: name '\0' owner; guarded by mu_
  std::map<std::string, FileWatch> watches_;           // key: file name; guarded by mu_
  std::map<int, std::string> by_wd_;                   // wd -> file name; guarded by mu_
  std::list<std::string> idle_;                        // idle watches, oldest first; guarded by mu_
  bool warned_watch_limit_ = false;                    // guarded by mu_

  WorkerLoop notifier_;  // last member: started after everything it uses, stopped first
};

constexpr const char* kTrustAdvice =
    ": another user could remove, replace or forge its lock files and tokens; use a directory that only "
    "you (or root) own and can write, e.g. chmod 700";

std::error_code url_error(std::string& why, std::string msg) {
  why = std::move(msg);
  return make_error_code(errc::invalid_url);
}

std::error_code unavailable(std::string& why, std::string msg) {
  why = std::move(msg);
  return make_error_code(errc::backend_unavailable);
}

/// mkdir -p: creates the missing directories of `dir` with mode 0700.
std::error_code make_directories(const std::string& dir, const std::string& url, std::string& why) {
  std::string prefix;
  std::size_t pos = 1;
  for (;;) {
    const std::size_t slash = dir.find('/', pos);
    prefix = dir.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      const int err = errno;
      if (err == ENOTDIR) {
        return url_error(why, "lock directory " + in_quotes(dir) + " of URL " + in_quotes(url) +
                                  ": a part of the path is not a directory");
      }
      return unavailable(why, "cannot create lock directory " + in_quotes(prefix) + " for URL " +
                                  in_quotes(url) + ": " + errno_text(err));
    }
    if (slash == std::string::npos) return {};
    pos = slash + 1;
  }
}

}  // namespace

std::string lock_file_name(std::string_view name, std::size_t name_max) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(name.size() + 5);
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (is_unreserved(c, i == 0)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  out += ".lock";
  if (out.size() <= name_max) return out;
  return sha256_hex(name) + ".hlock";
}

std::unique_ptr<Backend> make_file_backend(const Url& url, const ClientOptions& opts, std::error_code& ec,
                                           std::string& why) {
  const std::string shown = url.redacted();
  auto reject = [&](std::error_code e) -> std::unique_ptr<Backend> {
    ec = e;
    return nullptr;
  };
  if (url.has_userinfo) {
    return reject(
        url_error(why, "file URL " + in_quotes(shown) + " has user info; write file:///absolute/dir"));
  }
  if (!url.hosts.empty()) {
    return reject(url_error(why, "file URL " + in_quotes(shown) + " names host " +
                                     in_quotes(url.hosts[0].host) +
                                     ": the file backend is host-local and takes an absolute directory, "
                                     "file:///absolute/dir (three slashes; relative paths are not allowed)"));
  }
  if (url.path.empty() || url.path.front() != '/') {
    return reject(
        url_error(why, "file URL " + in_quotes(shown) + " has no directory; write file:///absolute/dir"));
  }
  Settings settings;
  // recheck= and sync= were checked against the scheme's table (registry.cpp).
  settings.recheck = query_duration(url, "recheck").value_or(settings.recheck);
  settings.sync = query_flag(url, "sync").value_or(settings.sync);
  std::string dir = std::filesystem::path(url.path).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  settings.dir = dir;

  if (auto e = make_directories(dir, shown, why)) return reject(e);
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) {
    const int err = errno;
    if (err == ENOTDIR) {
      return reject(url_error(why, "lock directory " + in_quotes(dir) + " of URL " + in_quotes(shown) +
                                       " exists but is not a directory"));
    }
    return reject(unavailable(why, "cannot open lock directory " + in_quotes(dir) + ": " + errno_text(err)));
  }
  struct stat st {};
  if (::fstat(dir_fd.get(), &st) != 0) {
    const int err = errno;
    return reject(unavailable(why, "cannot stat lock directory " + in_quotes(dir) + ": " + errno_text(err)));
  }
  // Like ssh's StrictModes: the lock directory and every directory above it must be
  // ours or root's, and nobody else may write them (above it, the sticky bit of /tmp
  // is enough). Otherwise another local user could remove, replace or forge lock files
  // and tokens, e.g. by creating /tmp/distlock-<uid> before us.
  if (std::string problem = trust_problem(st, /*directory=*/true, /*sticky_ok=*/false); !problem.empty()) {
    return reject(unavailable(why, "lock directory " + in_quotes(dir) + " " + problem + kTrustAdvice));
  }
  {
    std::error_code fs_ec;
    const std::filesystem::path real = std::filesystem::canonical(dir, fs_ec);
    if (fs_ec) {
      return reject(
          unavailable(why, "cannot resolve lock directory " + in_quotes(dir) + ": " + fs_ec.message()));
    }
    for (std::filesystem::path p = real.parent_path(); !p.empty(); p = p.parent_path()) {
      struct stat up {};
      if (::stat(p.c_str(), &up) != 0) {
        const int err = errno;
        return reject(unavailable(why, "cannot stat " + in_quotes(p.string()) + ": " + errno_text(err)));
      }
      if (std::string problem = trust_problem(up, /*directory=*/true, /*sticky_ok=*/true); !problem.empty()) {
        return reject(unavailable(why, "directory " + in_quotes(p.string()) + " " + problem +
                                           ", above lock directory " + in_quotes(dir) + kTrustAdvice));
      }
      if (p == p.root_path()) break;
    }
  }
  // Probe that we can create files here (access() says yes to root on read-only
  // pseudo file systems; a real create does not lie).
  const std::string probe = ".distlock-probe-" + random_client_id();
  Fd probe_fd(
      ::openat(dir_fd.get(), probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!probe_fd) {
    const int err = errno;
    return reject(
        unavailable(why, "lock directory " + in_quotes(dir) + " is not writable: " + errno_text(err)));
  }
  probe_fd.reset();
  ::unlinkat(dir_fd.get(), probe.c_str(), 0);

  long name_max = ::fpathconf(dir_fd.get(), _PC_NAME_MAX);
  if (name_max <= 0 || name_max > 255) name_max = 255;
  // Only the owner may open lock files (a reader could otherwise take a read lock and
  // block writers).
  const mode_t file_mode = 0600;
  return std::make_unique<FileBackend>(std::move(settings), std::move(dir_fd),
                                       static_cast<std::size_t>(name_max), file_mode, shown, opts);
}

}  // namespace distlock::detail
