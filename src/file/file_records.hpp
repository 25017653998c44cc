// Records and the listing of held locks for the file backend (file:///dir).
//
// Records live in the sub-directory "records" of the lock directory, one file per
// key, named like lock files but ending in ".rec" (".hrec" for hashed names), so a
// record and a lock of the same name never collide. A write goes to a temporary
// file that is fsynced, then renamed over the record (PutMode::always) or linked to
// its name (PutMode::if_absent: link() fails with EEXIST when the record exists,
// atomically across processes); PutMode::fenced reads the record and renames over it
// under an exclusive flock() of the records directory, which every fenced put takes, so
// an older term never replaces a newer one; the directory is fsynced after. A fenced put
// waits for that flock at most the client's command timeout (a process stopped while
// holding it would otherwise stall every other fenced put), then fails unavailable. A
// reader therefore sees a whole old or a whole new value, also after the writer was killed.
//
// The listing scans the lock directory and asks the kernel (F_OFD_GETLK, which
// neither takes nor disturbs any lock) whether each lock file is held now.
//
// Thread-safety: every call may come from any thread; nothing is cached.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/backend.hpp"
#include "engine/log.hpp"

namespace distlock::detail {

/// The file name (no directory) of the record `key` inside "records/": the lock
/// file name of `key` (see lock_file_name) with ".lock" replaced by ".rec" and
/// ".hlock" by ".hrec". Injective like lock_file_name.
std::string record_file_name(std::string_view key, std::size_t name_max = 255);

/// The lock name whose lock file is `fname` (the inverse of lock_file_name for the
/// percent-encoded form), or nullopt when `fname` is not such a file name (hashed
/// ".hlock" names, other files, non-canonical encodings).
std::optional<std::string> lock_name_of_file(std::string_view fname, std::size_t name_max = 255);

class FileRecords {
 public:
  /// `dir_fd` (the lock directory) is borrowed and must outlive this object.
  /// `lock_wait` bounds a fenced put's wait for the records directory's flock.
  FileRecords(int dir_fd, std::string dir, std::size_t name_max, Logger log, Millis lock_wait)
      : dir_fd_(dir_fd),
        dir_(std::move(dir)),
        name_max_(name_max),
        log_(std::move(log)),
        lock_wait_(lock_wait) {}

  std::string put(std::string_view key, std::string_view value, PutMode mode, Error& ec);
  std::optional<std::string> get(std::string_view key, Error& ec);
  bool erase(std::string_view key, Error& ec);
  std::vector<ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated, Error& ec);

 private:
  int open_records_dir(bool create, Error& ec);
  bool lock_records_dir(int rdir, Error& ec);
  std::optional<std::string> read_record_file(int rdir, const std::string& fname, std::string_view key,
                                              Error& ec);
  std::string path_of(const std::string& fname) const;
  void fail(Error& ec, errc code, const std::string& msg, int err);

  const int dir_fd_;
  const std::string dir_;
  const std::size_t name_max_;
  Logger log_;
  const Millis lock_wait_;
};

}  // namespace distlock::detail
