#include "file/file_records.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "engine/owner_id.hpp"
#include "file/file_backend.hpp"
#include "file/file_common.hpp"

namespace distlock::detail {

namespace {

using namespace file_io;

constexpr const char* kRecordDir = "records";

// ---- A record file ----------------------------------------------------------
//
// Offset  Size  Field
//      0     8  magic "DLRECF1\n"
//      8     4  key length (LE u32)
//     12     4  value length (LE u32)
//     16     -  key bytes, then value bytes; the file ends there
// Written whole to a temporary file before it gets the record's name, never in place.
constexpr std::array<char, 8> kRecMagic = {'D', 'L', 'R', 'E', 'C', 'F', '1', '\n'};
constexpr std::size_t kRecHeader = 16;
constexpr std::size_t kMaxKey = 4096;
constexpr std::size_t kMaxRecordFile = kRecHeader + kMaxKey + kMaxRecordValue;

std::string encode_record_file(std::string_view key, std::string_view value) {
  std::string out(kRecHeader, '\0');
  std::memcpy(out.data(), kRecMagic.data(), kRecMagic.size());
  put_le(out, 8, key.size(), 4);
  put_le(out, 12, value.size(), 4);
  out.append(key);
  out.append(value);
  return out;
}

bool write_all(int fd, std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = ENOSPC;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Removes the temporary file on every path out of put().
struct TempFile {
  int dir = -1;
  std::string name;
  bool linked = false;  // still has its temporary name
  void remove() noexcept {
    if (linked) ::unlinkat(dir, name.c_str(), 0);
    linked = false;
  }
  ~TempFile() { remove(); }
};

}  // namespace

std::string record_file_name(std::string_view key, std::size_t name_max) {
  std::string f = lock_file_name(key, name_max);
  if (f.ends_with(".hlock")) return f.substr(0, f.size() - 6) + ".hrec";
  return f.substr(0, f.size() - 5) + ".rec";
}

std::optional<std::string> lock_name_of_file(std::string_view fname, std::size_t name_max) {
  if (!fname.ends_with(".lock") || fname.size() == 5) return std::nullopt;
  const std::string_view enc = fname.substr(0, fname.size() - 5);
  std::string name;
  name.reserve(enc.size());
  for (std::size_t i = 0; i < enc.size(); ++i) {
    if (enc[i] != '%') {
      name.push_back(enc[i]);
      continue;
    }
    const int hi = i + 1 < enc.size() ? hex_value(enc[i + 1]) : -1;
    const int lo = i + 2 < enc.size() ? hex_value(enc[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    name.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  // Only the canonical form: a file that lock_file_name would not make is not a lock file.
  if (name.empty() || lock_file_name(name, name_max) != fname) return std::nullopt;
  return name;
}

std::string FileRecords::path_of(const std::string& fname) const {
  return (dir_ == "/" ? "" : dir_) + "/" + kRecordDir + (fname.empty() ? "" : "/" + fname);
}

void FileRecords::fail(Error& ec, errc code, const std::string& msg, int err) {
  ec = make_error_code(code);
  std::string full = msg;
  if (err) full += ": " + errno_text(err);
  log_.log(LogLevel::error, "file backend: {}", full);
  ec.set_detail(std::move(full));
}

int FileRecords::open_records_dir(bool create, Error& ec) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = ::openat(dir_fd_, kRecordDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT && create) {
        if (::mkdirat(dir_fd_, kRecordDir, 0700) != 0 && errno != EEXIST) {
          const int mk = errno;
          fail(ec, errc::backend_unavailable, "cannot create record directory " + path_of(""), mk);
          return -1;
        }
        (void)::fsync(dir_fd_);  // the new directory's entry; records are fsynced themselves
        continue;
      }
      if (err == ENOENT) return -1;  // no record was ever written: not an error
      fail(ec, errc::backend_unavailable, "cannot open record directory " + path_of(""), err);
      return -1;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail(ec, errc::backend_unavailable, "cannot stat record directory " + path_of(""), err);
      return -1;
    }
    if (std::string problem = trust_problem(st, /*directory=*/true, /*sticky_ok=*/false); !problem.empty()) {
      ::close(fd);
      fail(ec, errc::backend_unavailable,
           "record directory " + path_of("") + " " + problem +
               ": another user could forge or remove its records; it is not used (chmod 700 it)",
           0);
      return -1;
    }
    return fd;
  }
  fail(ec, errc::backend_unavailable, "record directory " + path_of("") + " keeps disappearing", 0);
  return -1;
}

std::optional<std::string> FileRecords::read_record_file(int rdir, const std::string& fname,
                                                         std::string_view key, Error& ec) {
  Fd fd(::openat(rdir, fname.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    const int err = errno;
    if (err == ENOENT) return std::nullopt;
    fail(ec, errc::backend_unavailable, "cannot open record file " + path_of(fname), err);
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    fail(ec, errc::backend_unavailable, "cannot stat record file " + path_of(fname), err);
    return std::nullopt;
  }
  if (std::string problem = trust_problem(st, /*directory=*/false, /*sticky_ok=*/false); !problem.empty()) {
    fail(ec, errc::backend_unavailable,
         "record file " + path_of(fname) + " " + problem + ": another user could forge it; it is not used",
         0);
    return std::nullopt;
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxRecordFile) {
    fail(ec, errc::protocol_error,
         "record file " + path_of(fname) + " is " + std::to_string(st.st_size) +
             " bytes, more than a record can be (it is not a distlock record file)",
         0);
    return std::nullopt;
  }
  std::string buf(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::pread(fd.get(), buf.data() + got, buf.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      fail(ec, errc::backend_unavailable, "cannot read record file " + path_of(fname), err);
      return std::nullopt;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  buf.resize(got);
  if (buf.size() < kRecHeader || std::memcmp(buf.data(), kRecMagic.data(), kRecMagic.size()) != 0) {
    fail(ec, errc::protocol_error,
         "record file " + path_of(fname) + " is not a distlock record file (no \"DLRECF1\" header)", 0);
    return std::nullopt;
  }
  const std::size_t key_len = get_le(buf, 8, 4);
  const std::size_t value_len = get_le(buf, 12, 4);
  if (key_len > kMaxKey || value_len > kMaxRecordValue || kRecHeader + key_len + value_len != buf.size()) {
    fail(ec, errc::protocol_error,
         "record file " + path_of(fname) + " is damaged (its lengths do not match its size of " +
             std::to_string(buf.size()) + " bytes)",
         0);
    return std::nullopt;
  }
  if (std::string_view(buf).substr(kRecHeader, key_len) != key) {
    fail(ec, errc::protocol_error,
         "record file " + path_of(fname) + " belongs to another key \"" +
             printable(std::string_view(buf).substr(kRecHeader, key_len)) + "\"",
         0);
    return std::nullopt;
  }
  return buf.substr(kRecHeader + key_len);
}

// The records directory's flock for a fenced put, waited for at most lock_wait_ (the
// client's command timeout) on this process's steady clock: its holder keeps it for a
// read and a rename, unless that process is stopped (SIGSTOP, a debugger, swapped out),
// and flock() itself cannot wait with a deadline. Polled at 1 ms, doubling up to 16 ms.
bool FileRecords::lock_records_dir(int rdir, Error& ec) {
  const auto deadline = std::chrono::steady_clock::now() + lock_wait_;
  Millis pause{1};
  for (;;) {
    if (::flock(rdir, LOCK_EX | LOCK_NB) == 0) return true;
    const int err = errno;
    if (err != EWOULDBLOCK && err != EINTR) {
      fail(ec, errc::backend_unavailable, "cannot lock record directory " + path_of(""), err);
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, Millis(16));
  }
  fail(ec, errc::backend_unavailable,
       "record directory " + path_of("") + " stayed locked by another fenced put for the command timeout (" +
           std::to_string(lock_wait_.count()) +
           " ms); a process stopped while it writes a record holds that lock until it resumes or exits",
       0);
  return false;
}

std::string FileRecords::put(std::string_view key, std::string_view value, PutMode mode, Error& ec) {
  ec.clear();
  if (!record_value_fits(key, value, ec)) return {};
  const std::string fname = record_file_name(key, name_max_);
  Fd rdir(open_records_dir(/*create=*/true, ec));
  if (ec) return {};
  // The whole record goes to a temporary file first; names starting with '.' are
  // never record names (a leading '.' is percent-encoded).
  TempFile tmp;
  tmp.dir = rdir.get();
  tmp.name = ".tmp-" + random_client_id();
  {
    Fd out(
        ::openat(rdir.get(), tmp.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!out) {
      const int err = errno;
      fail(ec, errc::backend_unavailable, "cannot create a temporary file in " + path_of(""), err);
      return {};
    }
    tmp.linked = true;
    if (!write_all(out.get(), encode_record_file(key, value)) || ::fsync(out.get()) != 0) {
      const int err = errno;
      fail(ec, errc::backend_unavailable, "cannot write record file " + path_of(tmp.name), err);
      return {};
    }
  }
  std::string stored(value);
  if (mode == PutMode::fenced) {
    // Fenced puts of every process take the records directory's flock for their
    // read-compare-rename (a read and a rename: held briefly), so no two interleave.
    if (!lock_records_dir(rdir.get(), ec)) return {};
    auto existing = read_record_file(rdir.get(), fname, key, ec);
    if (ec) return {};
    if (existing && !fenced_put_allowed(*existing, value)) {
      tmp.remove();
      return std::move(*existing);  // a newer term is there: refused
    }
  }
  if (mode != PutMode::if_absent) {
    if (::renameat(rdir.get(), tmp.name.c_str(), rdir.get(), fname.c_str()) != 0) {
      const int err = errno;
      fail(ec, errc::backend_unavailable, "cannot rename a temporary file to " + path_of(fname), err);
      return {};
    }
    tmp.linked = false;
  } else {
    // link() gives the record its name only if there is none: one atomic step that
    // every process agrees on. A record erased between our failed link and our read
    // is tried again.
    bool done = false;
    for (int attempt = 0; attempt < 16 && !done; ++attempt) {
      if (::linkat(rdir.get(), tmp.name.c_str(), rdir.get(), fname.c_str(), 0) == 0) {
        done = true;
        break;
      }
      const int err = errno;
      if (err != EEXIST) {
        fail(ec, errc::backend_unavailable, "cannot link a temporary file to " + path_of(fname), err);
        return {};
      }
      auto existing = read_record_file(rdir.get(), fname, key, ec);
      if (ec) return {};
      if (existing) {
        stored = std::move(*existing);
        done = true;
      }
    }
    tmp.remove();  // before the directory sync below, so it does not come back after a crash
    if (!done) {
      fail(ec, errc::backend_unavailable,
           "record file " + path_of(fname) + " keeps being created and removed while we write it", 0);
      return {};
    }
  }
  if (::fsync(rdir.get()) != 0) {
    const int err = errno;
    fail(ec, errc::backend_unavailable, "cannot sync record directory " + path_of(""), err);
    return {};
  }
  return stored;
}

std::optional<std::string> FileRecords::get(std::string_view key, Error& ec) {
  ec.clear();
  Fd rdir(open_records_dir(/*create=*/false, ec));
  if (!rdir) return std::nullopt;  // error, or no record directory yet
  return read_record_file(rdir.get(), record_file_name(key, name_max_), key, ec);
}

bool FileRecords::erase(std::string_view key, Error& ec) {
  ec.clear();
  Fd rdir(open_records_dir(/*create=*/false, ec));
  if (!rdir) return false;
  const std::string fname = record_file_name(key, name_max_);
  if (::unlinkat(rdir.get(), fname.c_str(), 0) != 0) {
    const int err = errno;
    if (err == ENOENT) return false;
    fail(ec, errc::backend_unavailable, "cannot remove record file " + path_of(fname), err);
    return false;
  }
  (void)::fsync(rdir.get());
  return true;
}

std::vector<ListedLock> FileRecords::list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                               Error& ec) {
  ec.clear();
  truncated = false;
  const std::string dir_path = dir_;
  const int scan_fd = ::openat(dir_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (scan_fd < 0) {
    const int err = errno;
    fail(ec, errc::backend_unavailable, "cannot read lock directory " + in_quotes(dir_path), err);
    return {};
  }
  std::unique_ptr<DIR, int (*)(DIR*)> dp(::fdopendir(scan_fd), &::closedir);
  if (!dp) {
    const int err = errno;
    ::close(scan_fd);
    fail(ec, errc::backend_unavailable, "cannot read lock directory " + in_quotes(dir_path), err);
    return {};
  }
  auto lock_path = [&](const std::string& fname) { return (dir_path == "/" ? "" : dir_path) + "/" + fname; };

  // Candidates (name, file name). A hashed file name tells nothing: its name is read
  // from the record inside it.
  std::vector<std::pair<std::string, std::string>> candidates;
  errno = 0;
  while (const dirent* e = ::readdir(dp.get())) {
    const std::string_view fname(e->d_name);
    if (fname.ends_with(".lock")) {
      auto name = lock_name_of_file(fname, name_max_);
      if (name && name->starts_with(prefix)) candidates.emplace_back(std::move(*name), std::string(fname));
    } else if (fname.ends_with(".hlock")) {
      candidates.emplace_back(std::string(), std::string(fname));
    }
  }
  if (errno != 0) {
    const int err = errno;
    fail(ec, errc::backend_unavailable, "cannot read lock directory " + in_quotes(dir_path), err);
    return {};
  }

  auto look = [&](const std::string& fname, std::string_view expected) -> std::optional<ListedLock> {
    Fd fd(::openat(dir_fd_, fname.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd) return std::nullopt;  // removed meanwhile (or not openable: status() reports that)
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !trust_problem(st, false, false).empty()) {
      log_.log(LogLevel::warning,
               "file backend: lock file {} is not listed: it is not a regular file of yours",
               lock_path(fname));
      return std::nullopt;
    }
    // F_OFD_GETLK only asks: it takes nothing and disturbs no holder.
    if (!locked_by_someone(fd.get())) return std::nullopt;
    Record rec;
    Error rec_ec;
    for (int i = 0; i < 3; ++i) {  // a holder may be writing its record right now
      if (!(rec_ec = read_record(fd.get(), rec))) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (rec_ec) {
      log_.log(LogLevel::warning, "file backend: lock file {} is not listed: {}", lock_path(fname),
               rec_ec.detail());
      return std::nullopt;
    }
    ListedLock l;
    if (expected.empty()) {  // hashed file name: the name is the record's
      if (!rec.present || !rec.name.starts_with(prefix) || lock_file_name(rec.name, name_max_) != fname) {
        return std::nullopt;
      }
      l.name = rec.name;
    } else {
      if (rec.present && rec.name != expected) return std::nullopt;  // a foreign file: status() refuses it
      l.name = std::string(expected);
    }
    l.info = lock_info_of(/*held=*/true, rec);
    return l;
  };

  // Hashed names first (their name must be read to sort), then everything in order.
  std::vector<ListedLock> hashed;
  for (auto& [name, fname] : candidates) {
    if (!name.empty()) continue;
    if (auto l = look(fname, {})) hashed.push_back(std::move(*l));
  }
  std::erase_if(candidates, [](const auto& c) { return c.first.empty(); });
  std::sort(candidates.begin(), candidates.end());
  std::sort(hashed.begin(), hashed.end(), [](const auto& a, const auto& b) { return a.name < b.name; });

  std::vector<ListedLock> out;
  auto h = hashed.begin();
  auto c = candidates.begin();
  while (h != hashed.end() || c != candidates.end()) {
    std::optional<ListedLock> next;
    if (h != hashed.end() && (c == candidates.end() || h->name < c->first)) {
      next = std::move(*h++);
    } else {
      next = look(c->second, c->first);
      ++c;
      if (!next) continue;
    }
    if (out.size() == limit) {
      truncated = true;
      break;
    }
    out.push_back(std::move(*next));
  }
  return out;
}

}  // namespace distlock::detail
