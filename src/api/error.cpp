#include "distlock/error.hpp"

namespace distlock {

namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "distlock"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::busy: return "lock is busy (held by an owner other than this call)";
      case errc::timeout: return "timed out waiting for the lock";
      case errc::lost: return "lock was lost (lease expired or taken over)";
      case errc::not_owner: return "caller does not hold the lock";
      case errc::backend_unavailable: return "lock service unavailable";
      case errc::auth_failed: return "authentication with the lock service failed";
      case errc::invalid_argument: return "invalid argument";
      case errc::invalid_url: return "invalid backend URL";
      case errc::quorum_unavailable: return "fewer than a quorum of lock servers reachable";
      case errc::protocol_error: return "unexpected reply from the lock service";
      case errc::not_supported: return "not supported by this backend";
      case errc::exhausted: return "resource exhausted";
      case errc::clock_moved_backwards: return "clock moved backwards";
      case errc::cancelled: return "the wait was cancelled";
      case errc::forked:
        return "client used in a child process after fork(); connect anew in the child (its connections, "
               "identity and leases belong to the parent)";
    }
    return "unknown distlock error " + std::to_string(value);
  }
  std::error_condition default_error_condition(int value) const noexcept override {
    switch (static_cast<errc>(value)) {
      case errc::timeout: return std::errc::timed_out;
      case errc::cancelled: return std::errc::operation_canceled;
      case errc::busy: return std::errc::resource_unavailable_try_again;
      case errc::not_owner: return std::errc::operation_not_permitted;
      case errc::invalid_argument:
      case errc::invalid_url: return std::errc::invalid_argument;
      case errc::not_supported: return std::errc::not_supported;
      case errc::backend_unavailable:
      case errc::quorum_unavailable: return std::errc::host_unreachable;
      case errc::auth_failed: return std::errc::permission_denied;
      default: return {value, *this};
    }
  }
};

}  // namespace

const std::error_category& category() noexcept {
  static const Category instance;
  return instance;
}

void throw_error(std::error_code ec, const std::string& what) {
  throw std::system_error(ec, what);
}

}  // namespace distlock
