// Internal to the file backend (src/file/): the owned descriptor, the lock file's
// record format and the kernel-lock and trust checks, shared by file_backend.cpp
// (locks) and file_records.cpp (records and listing).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "distlock/client.hpp"
#include "distlock/error.hpp"
#include "engine/backend_error.hpp"
#include "engine/errno_text.hpp"

namespace distlock::detail::file_io {

/// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

inline std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

// ---- The lock file's record -------------------------------------------------
//
// Offset  Size  Field
//      0     8  magic "DLOCKF1\n"
//      8     8  fencing token last issued (little-endian u64)
//     16     8  pid of the holder that issued it (little-endian i64)
//     24     8  wall-clock time of that acquisition, ms since the Unix epoch (LE u64)
//     32     4  owner id length (LE u32)
//     36     4  lock name length (LE u32)
//     40     -  lock name bytes, then owner id bytes
// The name comes first: it is the same on every write, so a write cut short (the
// holder killed in the middle of a long record) can only garble the owner id.
// Written only while holding the lock, in one pwrite at offset 0. An empty file is a
// lock that was never taken (token 0).
inline constexpr std::array<char, 8> kMagic = {'D', 'L', 'O', 'C', 'K', 'F', '1', '\n'};
inline constexpr std::size_t kHeaderSize = 40;
inline constexpr std::size_t kMaxRecordSize = kHeaderSize + 4096 + 1024;

struct Record {
  bool present = false;  // false: empty file, no token issued yet
  std::uint64_t token = 0;
  std::int64_t pid = 0;
  std::uint64_t acquired_unix_ms = 0;
  std::string owner;
  std::string name;
};

inline void put_le(std::string& out, std::size_t at, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline std::uint64_t get_le(std::string_view in, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

inline std::string encode_record(const Record& r) {
  std::string out(kHeaderSize, '\0');
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  put_le(out, 8, r.token, 8);
  put_le(out, 16, static_cast<std::uint64_t>(r.pid), 8);
  put_le(out, 24, r.acquired_unix_ms, 8);
  put_le(out, 32, r.owner.size(), 4);
  put_le(out, 36, r.name.size(), 4);
  out += r.name;
  out += r.owner;
  return out;
}

/// Reads the record of an open lock file. An empty file gives present=false.
/// Anything else that does not parse is errc::protocol_error, the detail saying what is
/// wrong with it; a failed fstat or read is backend_unavailable.
inline Error read_record(int fd, Record& r) {
  r = Record{};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return {make_error_code(errc::backend_unavailable), "fstat failed: " + errno_text(errno)};
  }
  if (st.st_size == 0) return {};
  const auto size = static_cast<std::size_t>(std::min<off_t>(st.st_size, kMaxRecordSize));
  std::string buf(size, '\0');
  const ssize_t n = ::pread(fd, buf.data(), size, 0);
  if (n < 0) {
    return {make_error_code(errc::backend_unavailable), "read failed: " + errno_text(errno)};
  }
  buf.resize(static_cast<std::size_t>(n));
  if (buf.size() < kHeaderSize || std::memcmp(buf.data(), kMagic.data(), kMagic.size()) != 0) {
    return {make_error_code(errc::protocol_error), "it is not a distlock lock file (no \"DLOCKF1\" header)"};
  }
  const std::size_t owner_len = get_le(buf, 32, 4);
  const std::size_t name_len = get_le(buf, 36, 4);
  if (owner_len > 1024 || name_len > 4096 || kHeaderSize + owner_len + name_len > buf.size()) {
    return {make_error_code(errc::protocol_error),
            "its header is damaged (lengths beyond the end of the file)"};
  }
  r.present = true;
  r.token = get_le(buf, 8, 8);
  r.pid = static_cast<std::int64_t>(get_le(buf, 16, 8));
  r.acquired_unix_ms = get_le(buf, 24, 8);
  r.name = buf.substr(kHeaderSize, name_len);
  r.owner = buf.substr(kHeaderSize + name_len, owner_len);
  return {};
}

// Whole-file OFD lock requests.
inline struct flock whole_file(short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // to the end of the file, however long it grows
  fl.l_pid = 0;  // must be 0 for OFD locks
  return fl;
}

/// True when somebody (any other open file description) holds a lock on the file.
inline bool locked_by_someone(int fd) {
  struct flock fl = whole_file(F_WRLCK);
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;  // unknown: say held, the caller re-checks
  return fl.l_type != F_UNLCK;
}

inline bool same_inode(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

inline std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

/// Like ssh's StrictModes: what makes a file or directory untrustworthy for locks, or
/// "" when nothing does. It must be owned by us or root; a lock file must be a regular
/// file; a directory must not be writable by its group or by every user, except a
/// directory *above* the lock directory with the sticky bit (like /tmp), where others
/// may create but not remove or rename our entries.
inline std::string trust_problem(const struct stat& st, bool directory, bool sticky_ok) {
  std::string problem;
  auto add = [&problem](const std::string& p) { problem += (problem.empty() ? "" : " and ") + p; };
  if (directory ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    add(directory ? "is not a directory" : "is not a regular file");
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    add("is owned by uid " + std::to_string(st.st_uid) + " (not by you, uid " + std::to_string(me) +
        ", nor by root)");
  }
  if (directory && !(sticky_ok && (st.st_mode & S_ISVTX))) {
    if (st.st_mode & S_IWOTH) {
      add("is writable by every user (mode " + mode_text(st.st_mode) + ")");
    } else if (st.st_mode & S_IWGRP) {
      add("is writable by its group (mode " + mode_text(st.st_mode) + ")");
    }
  }
  return problem;
}

/// What status() says of a lock file that is held now, from its record.
inline LockInfo lock_info_of(bool held, const Record& rec) {
  LockInfo info;
  info.held = held;
  info.token = rec.token;
  if (held && rec.present) {
    // The pid goes after the owner id, before any holder description ("|..."), which the
    // engine splits off into LockInfo::holder_info.
    const auto bar = rec.owner.find('|');
    info.holder = rec.owner.substr(0, bar) + " (pid " + std::to_string(rec.pid) + ")" +
                  (bar == std::string::npos ? std::string() : rec.owner.substr(bar));
  }
  return info;
}

/// A name for messages: control bytes escaped, long names cut.
inline std::string printable(std::string_view name) {
  std::string out;
  for (unsigned char c : name.substr(0, 200)) {
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (name.size() > 200) out += "...";
  return out;
}

}  // namespace distlock::detail::file_io
