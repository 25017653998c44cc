// file:///absolute/dir — the host-local backend and the embedded default.
//
// One lock file per lock name in one directory; a lock is an open-file-description
// lock (fcntl F_OFD_SETLK) on the whole file, taken through an open file description
// of its own per held lock. So two threads of one process contend like two
// processes, and when a holder dies (even by SIGKILL) the kernel drops its lock the
// moment its last descriptor closes. There is no TTL: a lock is held until it is
// released or its process ends (a paused process keeps it).
//
// Fencing tokens live in the lock file and are written only while the lock is held,
// so they strictly increase per name across processes and restarts, as long as the
// file is kept (lock files are never deleted by distlock). Waiters are woken by
// inotify close events on the lock file, one inotify descriptor and one thread per
// client. Layout and caveats: docs/file-backend.md.
//
// Thread-safety: a FileBackend may be called from any number of threads at once.
//
// Example:
//   auto client = distlock::connect("file:///run/user/1000/distlock");
//   auto lease = client.acquire("nightly-report");   // other processes now wait
//   write_report(lease.token());
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "engine/backend.hpp"

namespace distlock::detail {

/// The file name (no directory) that holds the lock `name`: every byte outside
/// [A-Za-z0-9._-] (and a leading '.') percent-encoded, plus ".lock"; when that
/// exceeds `name_max` bytes, the SHA-256 of the name in hex plus ".hlock". Injective:
/// encoded names end in ".lock", hashed ones in "hlock".
std::string lock_file_name(std::string_view name, std::size_t name_max = 255);

/// Makes a backend for `file:///absolute/dir[?recheck=1s&sync=false]`. Errors:
/// invalid_url (host given, relative or missing path, unknown query key, path is not
/// a directory), backend_unavailable (the directory cannot be created or written).
std::unique_ptr<Backend> make_file_backend(const Url& url, const ClientOptions& opts, Error& err);

}  // namespace distlock::detail
