// The file backend's private declarations, shared by its files: file_lock.cpp
// (acquire, renew, release, status), file_notifier.cpp (inotify watches and the
// notifier thread) and file_backend.cpp (lock file names, construction, factory).
// Not for use outside src/file.
#pragma once

#include <sys/inotify.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/log.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/worker_loop.hpp"
#include "file/file_backend.hpp"
#include "file/file_common.hpp"
#include "file/file_records.hpp"

namespace distlock::detail::file {

using namespace file_io;
using SteadyClock = std::chrono::steady_clock;

struct Settings {
  std::string dir;
  Millis recheck{std::chrono::seconds(1)};
  bool sync = false;
};

class FileBackend final : public RecordsBackend<FileRecords> {
 public:
  FileBackend(Settings settings, Fd dir_fd, std::size_t name_max, mode_t file_mode, std::string url,
              const ClientOptions& opts);

  ~FileBackend() override {
    notifier_.stop();
    // Any lock still held (the engine releases its leases first) is dropped by closing.
    LockGuard lk(mu_);
    held_.clear();
    watches_.clear();
  }

  Capabilities capabilities() const noexcept override { return {true, false}; }
  void set_listener(ChangeListener* l) override { listener_.store(l, std::memory_order_release); }

  AcquireResult try_acquire(const AcquireRequest& req, Error& ec) override;
  void renew(std::span<const RenewItem> items, std::span<RenewStatus> out, Error& ec) override;
  ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                        Error& ec) override;
  void watch(std::string_view name, Error& ec) override;
  void unwatch(std::string_view name) noexcept override;
  LockInfo status(std::string_view name, Error& ec) override;

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

  std::string untrusted(int fd, const std::string& fname) const;
  AcquireResult fail(Error& ec, errc code, const std::string& what, int err);
  bool still_linked(const HeldFile& h) const;
  void set_watch_mask(const std::string& fname, FileWatch& w, std::uint32_t mask) DISTLOCK_REQUIRES(mu_);
  void add_watch_ref(const std::string& fname, std::string_view name, bool wait) DISTLOCK_REQUIRES(mu_);
  void drop_watch_ref(const std::string& fname, bool wait) DISTLOCK_REQUIRES(mu_);

  // ---- The notifier thread: one per client, shared by every wait. ----

  struct Actions {
    std::vector<std::string> changed;                       // lock names that may be free
    std::vector<std::pair<std::string, std::string>> lost;  // (name, owner) whose file went away
  };

  void notifier_main();
  void handle_event(const struct inotify_event& ev, Actions& actions) DISTLOCK_REQUIRES(mu_);
  void on_file_event(const std::string& fname, FileWatch& w, std::uint32_t mask, Actions& actions)
      DISTLOCK_REQUIRES(mu_);
  void run_due_confirms(Actions& actions) DISTLOCK_REQUIRES(mu_);
  void deliver(Actions& actions);

  const Settings settings_;
  const Fd dir_fd_;
  const std::size_t name_max_;
  const mode_t file_mode_;
  const std::string url_;
  Logger log_;
  FileRecords records_;
  std::atomic<ChangeListener*> listener_{nullptr};  // set once, before any watch

  Fd inotify_fd_;

  AnnotatedMutex mu_;
  std::map<std::string, HeldFile, std::less<>> held_ DISTLOCK_GUARDED_BY(mu_);  // key: name '\0' owner
  std::map<std::string, FileWatch> watches_ DISTLOCK_GUARDED_BY(mu_);           // key: file name
  std::map<int, std::string> by_wd_ DISTLOCK_GUARDED_BY(mu_);                   // wd -> file name
  std::list<std::string> idle_ DISTLOCK_GUARDED_BY(mu_);                        // idle watches, oldest first
  bool warned_watch_limit_ DISTLOCK_GUARDED_BY(mu_) = false;

  WorkerLoop notifier_;  // last member: started after everything it uses, stopped first
};

}  // namespace distlock::detail::file
