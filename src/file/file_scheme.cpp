#include "file/file_scheme.hpp"

#include "file/file_backend.hpp"

namespace distlock::detail {

namespace {
using T = QueryType;

constexpr QueryKey kFileKeys[] = {
    {"recheck", T::duration,
     "how often a waiter re-checks a lock besides the inotify notification (a missed event costs at "
     "most this)",
     "1s"},
    {"sync", T::flag, "fsync token files, so tokens stay increasing across a power loss", "false"},
    {"timeout", T::duration, "accepted for uniformity; the file backend does no network I/O", "2s"},
};

constexpr Scheme kSchemes[] = {
    {"file", "file:///absolute/dir", "this host only (kernel locks on files in the directory)", false, "",
     kFileKeys, &make_file_backend},
};
}  // namespace

std::span<const Scheme> file_schemes() noexcept {
  return kSchemes;
}

}  // namespace distlock::detail
