// Interim: the connection layer lands first so Redlock, fencing and ids can build
// on it; the lock scripts follow in the next commit.
#include "redis/redis_backend.hpp"

namespace distlock::detail {

std::unique_ptr<Backend> make_redis_backend(const Url& url, const ClientOptions&, std::error_code& ec,
                                            std::string& why) {
  ec = make_error_code(errc::not_supported);
  why = "redis:// backend (" + url.redacted() + ") is not finished yet";
  return nullptr;
}

}  // namespace distlock::detail
