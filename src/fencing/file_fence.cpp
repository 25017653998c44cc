// FileFence: the fence of a file-stored resource is a small file holding the highest
// token seen, as 20 zero-padded decimal digits. Every apply() takes the file's
// kernel lock for the whole check-record-write, so writers on this host (threads or
// processes) are serialised and a stale one can never write after a newer one.
//
// OFD locks (fcntl F_OFD_SETLKW) belong to the open file description, so two threads
// of one process exclude each other as two processes do; kernels without them get
// flock(), which has the same per-description semantics. Either lock is dropped by
// the kernel when the descriptor is closed, including when the process dies.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

#include "distlock/fencing.hpp"
#include "engine/errno_text.hpp"

namespace distlock {

namespace {

constexpr std::size_t kTokenWidth = 20;  // digits of UINT64_MAX

[[noreturn]] void throw_io(const std::filesystem::path& p, const char* what, int err) {
  throw_error(
      make_error_code(errc::backend_unavailable),
      std::string("fence file ") + p.string() + ": " + what + ": " + distlock::detail::errno_text(err));
}

/// Opens the fence file without following a symbolic link (O_NOFOLLOW) and without
/// blocking on a FIFO (O_NONBLOCK; no effect on regular files), then checks that it is
/// a regular file owned by the caller or root: another user's file could be unlocked
/// or rewritten by that user, and a link could point the fence at any other file.
/// Returns the descriptor, or -1 with errno set when the file does not exist or cannot
/// be opened; throws backend_unavailable naming the file when it is not trustworthy.
int open_fence_file(const std::filesystem::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) {
    if (errno == ELOOP) {
      throw_error(make_error_code(errc::backend_unavailable),
                  "fence file " + p.string() + " is a symbolic link: not followed (use the real path)");
    }
    return -1;
  }
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = std::string("cannot be examined: ") + distlock::detail::errno_text(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    problem = "is owned by uid " + std::to_string(st.st_uid) + " (not by you, uid " +
              std::to_string(::geteuid()) + ", nor by root): that user could unlock or rewrite it";
  }
  if (!problem.empty()) {
    ::close(fd);
    throw_error(make_error_code(errc::backend_unavailable), "fence file " + p.string() + " " + problem);
  }
  return fd;
}

/// An open fence file, exclusively locked for the object's lifetime.
class LockedFenceFile {
 public:
  explicit LockedFenceFile(const std::filesystem::path& p) : path_(p) {
    fd_ = open_fence_file(p, O_RDWR | O_CREAT);
    if (fd_ < 0) throw_io(p, "cannot open", errno);
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    int rc;
    while ((rc = ::fcntl(fd_, F_OFD_SETLKW, &fl)) != 0 && errno == EINTR) {
    }
    if (rc != 0 && errno == EINVAL) {  // no OFD locks on this kernel or file system
      while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
      }
    }
    if (rc != 0) {
      const int err = errno;
      ::close(fd_);
      throw_io(p, "cannot lock", err);
    }
  }
  ~LockedFenceFile() { ::close(fd_); }  // drops the lock
  LockedFenceFile(const LockedFenceFile&) = delete;
  LockedFenceFile& operator=(const LockedFenceFile&) = delete;

  std::uint64_t read_token() const { return parse(fd_, path_); }

  void write_token(std::uint64_t token) const {
    char buf[kTokenWidth + 1];
    std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(token));
    buf[kTokenWidth] = '\n';
    // Same length every time: one in-place pwrite, never a truncated file.
    const ssize_t n = ::pwrite(fd_, buf, sizeof buf, 0);
    if (n != static_cast<ssize_t>(sizeof buf)) throw_io(path_, "cannot write", n < 0 ? errno : EIO);
  }

  static std::uint64_t parse(int fd, const std::filesystem::path& p) {
    char buf[64];
    const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
    if (n < 0) throw_io(p, "cannot read", errno);
    std::string_view text(buf, static_cast<std::size_t>(n));
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    if (text.empty()) return 0;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw_error(make_error_code(errc::protocol_error),
                  "fence file " + p.string() + " does not hold a token: \"" + std::string(text) + "\"");
    }
    return v;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace

FileFence::FileFence(std::filesystem::path fence_file) : path_(std::move(fence_file)) {
  if (path_.empty()) throw_error(make_error_code(errc::invalid_argument), "fence file path is empty");
}

FenceResult FileFence::apply(std::uint64_t token, const std::function<void()>& write) {
  LockedFenceFile f(path_);
  const std::uint64_t seen = f.read_token();
  if (token < seen) return {FenceStatus::stale, seen};
  if (token > seen) f.write_token(token);
  if (write) write();
  return {FenceStatus::applied, token};
}

FenceResult FileFence::apply(std::uint64_t token, const std::function<void()>& write,
                             std::error_code& ec) noexcept {
  ec.clear();
  try {
    return apply(token, write);
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return {};
}

std::uint64_t FileFence::highest_token() const {
  const int fd = open_fence_file(path_, O_RDONLY);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    throw_io(path_, "cannot open", errno);
  }
  try {
    const std::uint64_t v = LockedFenceFile::parse(fd, path_);
    ::close(fd);
    return v;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

void FileFence::reset() {
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) throw_io(path_, "cannot remove", errno);
}

}  // namespace distlock
