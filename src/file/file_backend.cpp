// The file backend's lock file names, its construction (inotify, the notifier
// thread) and the factory that checks and opens the lock directory.
#include "file/file_backend.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <filesystem>

#include "engine/owner_id.hpp"
#include "engine/scheme.hpp"
#include "file/file_backend_impl.hpp"

namespace distlock::detail {

namespace file {

FileBackend::FileBackend(Settings settings, Fd dir_fd, std::size_t name_max, mode_t file_mode,
                         std::string url, const ClientOptions& opts)
    : settings_(std::move(settings)),
      dir_fd_(std::move(dir_fd)),
      name_max_(name_max),
      file_mode_(file_mode),
      url_(std::move(url)),
      log_(opts.logger),
      records_(dir_fd_.get(), settings_.dir, name_max_, log_, opts.command_timeout) {
  inotify_fd_ = Fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  int err = errno;
  if (!notifier_.valid()) err = notifier_.error();
  if (!inotify_fd_ || !notifier_.valid()) {
    // Without inotify (e.g. fs.inotify.max_user_instances reached) waiters still
    // progress through the engine's fallback re-check every `recheck`.
    log_.log(LogLevel::warning,
             "file backend {}: inotify unavailable ({}); waiters fall back to re-checking every {} ms", url_,
             errno_text(err), settings_.recheck.count());
    inotify_fd_.reset();
    return;
  }
  notifier_.start([this] { notifier_main(); });
}

}  // namespace file

namespace {

using namespace file_io;

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

constexpr const char* kTrustAdvice =
    ": another user could remove, replace or forge its lock files and tokens; use a directory that only "
    "you (or root) own and can write, e.g. chmod 700";

Error url_error(std::string msg) {
  return {make_error_code(errc::invalid_url), std::move(msg)};
}

Error unavailable(std::string msg) {
  return {make_error_code(errc::backend_unavailable), std::move(msg)};
}

/// mkdir -p: creates the missing directories of `dir` with mode 0700.
Error make_directories(const std::string& dir, const std::string& url) {
  std::string prefix;
  std::size_t pos = 1;
  for (;;) {
    const std::size_t slash = dir.find('/', pos);
    prefix = dir.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      const int err = errno;
      if (err == ENOTDIR) {
        return url_error("lock directory " + in_quotes(dir) + " of URL " + in_quotes(url) +
                         ": a part of the path is not a directory");
      }
      return unavailable("cannot create lock directory " + in_quotes(prefix) + " for URL " + in_quotes(url) +
                         ": " + errno_text(err));
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

// `error`, not `err`: errno values below are called err.
std::unique_ptr<Backend> make_file_backend(const Url& url, const ClientOptions& opts, Error& error) {
  const std::string shown = url.redacted();
  auto reject = [&](Error e) -> std::unique_ptr<Backend> {
    error = std::move(e);
    return nullptr;
  };
  if (url.has_userinfo) {
    return reject(url_error("file URL " + in_quotes(shown) + " has user info; write file:///absolute/dir"));
  }
  if (!url.hosts.empty()) {
    return reject(url_error("file URL " + in_quotes(shown) + " names host " + in_quotes(url.hosts[0].host) +
                            ": the file backend is host-local and takes an absolute directory, "
                            "file:///absolute/dir (three slashes; relative paths are not allowed)"));
  }
  if (url.path.empty() || url.path.front() != '/') {
    return reject(
        url_error("file URL " + in_quotes(shown) + " has no directory; write file:///absolute/dir"));
  }
  file::Settings settings;
  // recheck= and sync= were checked against this folder's scheme entry (file_scheme.cpp).
  settings.recheck = query_duration(url, "recheck").value_or(settings.recheck);
  settings.sync = query_flag(url, "sync").value_or(settings.sync);
  std::string dir = std::filesystem::path(url.path).lexically_normal().string();
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  settings.dir = dir;

  if (Error e = make_directories(dir, shown)) return reject(std::move(e));
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) {
    const int err = errno;
    if (err == ENOTDIR) {
      return reject(url_error("lock directory " + in_quotes(dir) + " of URL " + in_quotes(shown) +
                              " exists but is not a directory"));
    }
    return reject(unavailable("cannot open lock directory " + in_quotes(dir) + ": " + errno_text(err)));
  }
  struct stat st {};
  if (::fstat(dir_fd.get(), &st) != 0) {
    const int err = errno;
    return reject(unavailable("cannot stat lock directory " + in_quotes(dir) + ": " + errno_text(err)));
  }
  // Like ssh's StrictModes: the lock directory and every directory above it must be
  // ours or root's, and nobody else may write them (above it, the sticky bit of /tmp
  // is enough). Otherwise another local user could remove, replace or forge lock files
  // and tokens, e.g. by creating /tmp/distlock-<uid> before us.
  if (std::string problem = trust_problem(st, /*directory=*/true, /*sticky_ok=*/false); !problem.empty()) {
    return reject(unavailable("lock directory " + in_quotes(dir) + " " + problem + kTrustAdvice));
  }
  {
    std::error_code fs_ec;
    const std::filesystem::path real = std::filesystem::canonical(dir, fs_ec);
    if (fs_ec) {
      return reject(unavailable("cannot resolve lock directory " + in_quotes(dir) + ": " + fs_ec.message()));
    }
    for (std::filesystem::path p = real.parent_path(); !p.empty(); p = p.parent_path()) {
      struct stat up {};
      if (::stat(p.c_str(), &up) != 0) {
        const int err = errno;
        return reject(unavailable("cannot stat " + in_quotes(p.string()) + ": " + errno_text(err)));
      }
      if (std::string problem = trust_problem(up, /*directory=*/true, /*sticky_ok=*/true); !problem.empty()) {
        return reject(unavailable("directory " + in_quotes(p.string()) + " " + problem +
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
    return reject(unavailable("lock directory " + in_quotes(dir) + " is not writable: " + errno_text(err)));
  }
  probe_fd.reset();
  ::unlinkat(dir_fd.get(), probe.c_str(), 0);

  long name_max = ::fpathconf(dir_fd.get(), _PC_NAME_MAX);
  if (name_max <= 0 || name_max > 255) name_max = 255;
  // Only the owner may open lock files (a reader could otherwise take a read lock and
  // block writers).
  const mode_t file_mode = 0600;
  return std::make_unique<file::FileBackend>(std::move(settings), std::move(dir_fd),
                                             static_cast<std::size_t>(name_max), file_mode, shown, opts);
}

}  // namespace distlock::detail
