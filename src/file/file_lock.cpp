// File locks: acquire (OFD lock, then the next fencing token in the file), renew,
// release and status, and the checks on an open lock file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <limits>
#include <thread>

#include "file/file_backend_impl.hpp"

namespace distlock::detail::file {

AcquireResult FileBackend::try_acquire(const AcquireRequest& req, Error& ec) {
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
    if (const Error bad = read_record(fd.get(), rec)) {
      ec = std::error_code(bad);  // the cause is logged; the call's error keeps its own detail
      log_.log(LogLevel::error, "file backend: lock file {} of lock \"{}\": {}", path_of(fname),
               printable(req.name), bad.detail());
      return {};
    }
    if (rec.present && rec.name != req.name) {
      // A SHA-256 collision, or a file written by something else: never take it over.
      return fail(
          ec, errc::protocol_error,
          "lock file " + path_of(fname) + " belongs to another lock name \"" + printable(rec.name) + "\"", 0);
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
    rec.acquired_unix_ms = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
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
    LockGuard lk(mu_);
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

void FileBackend::renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) {
  ec.clear();
  LockGuard lk(mu_);
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto it = held_.find(held_key(items[i].name, items[i].owner));
    const bool ours = it != held_.end() && it->second.token == items[i].token && still_linked(it->second);
    out[i] = ours ? RenewStatus::renewed : RenewStatus::not_owner;
  }
}

ReleaseStatus FileBackend::release(std::string_view name, std::string_view owner, std::uint64_t token,
                                   Error& ec) {
  ec.clear();
  HeldFile held;
  {
    LockGuard lk(mu_);
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

LockInfo FileBackend::status(std::string_view name, Error& ec) {
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
  Error bad;
  for (int i = 0; i < 3; ++i) {
    if (!(bad = read_record(fd.get(), rec))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (bad) {
    ec = std::error_code(bad);  // the cause is logged; the call's error keeps its own detail
    log_.log(LogLevel::error, "file backend: lock file {}: {}", path_of(fname), bad.detail());
    return {};
  }
  return lock_info_of(info.held, rec);
}

/// "" when the open lock file may be used, else a message naming it and its problem.
std::string FileBackend::untrusted(int fd, const std::string& fname) const {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "cannot stat lock file " + path_of(fname) + ": " + errno_text(errno);
  std::string problem = trust_problem(st, /*directory=*/false, /*sticky_ok=*/false);
  if (problem.empty()) return problem;
  return "lock file " + path_of(fname) + " " + problem +
         ": another user could unlock it or forge its token; it is not used (remove it, or chown it to "
         "yourself, when no process uses it)";
}

AcquireResult FileBackend::fail(Error& ec, errc code, const std::string& what, int err) {
  ec = make_error_code(code);
  log_.log(LogLevel::error, "file backend: {}{}{}", what, err ? ": " : "", err ? errno_text(err) : "");
  return {};
}

/// The held descriptor's file is still the one at its path (not removed or replaced).
bool FileBackend::still_linked(const HeldFile& h) const {
  struct stat ours {
  }, at_path{};
  if (::fstat(h.fd.get(), &ours) != 0 || ours.st_nlink == 0) return false;
  if (::fstatat(dir_fd_.get(), h.fname.c_str(), &at_path, AT_SYMLINK_NOFOLLOW) != 0) return false;
  return same_inode(ours, at_path);
}

}  // namespace distlock::detail::file
