// Test support: a backend that forwards every call to another one (usually a
// memory:// backend) and keeps the engine's listener, so that an engine test
// overrides only the call it disturbs (a loss reported while a grant is answered, a
// validity change, a counted read) instead of restating the whole interface.
//
// Thread-safety: as the backend it wraps; the listener is set once, before any call.
//
// Example:
//   class LosesNextGrant final : public distlock::testing::ForwardingBackend {
//     using ForwardingBackend::ForwardingBackend;
//     distlock::detail::AcquireResult try_acquire(const distlock::detail::AcquireRequest& r,
//                                                 detail::Error& ec) override {
//       auto res = ForwardingBackend::try_acquire(r, ec);
//       if (res.acquired) listener()->on_lease_lost(r.name, r.owner);
//       return res;
//     }
//   };
//   LosesNextGrant* raw = nullptr;  // owned by the client's engine
//   auto c = distlock::testing::client_through<LosesNextGrant>(store_name, opts, &raw);
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "api/client_access.hpp"
#include "distlock/distlock.hpp"
#include "engine/backend.hpp"
#include "engine/engine.hpp"
#include "engine/url.hpp"
#include "fake/memory_backend.hpp"

namespace distlock::testing {

class ForwardingBackend : public detail::Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<detail::Backend> inner) : inner_(std::move(inner)) {}

  detail::Capabilities capabilities() const noexcept override { return inner_->capabilities(); }
  void set_listener(detail::ChangeListener* l) override {
    listener_ = l;
    inner_->set_listener(l);
  }
  detail::AcquireResult try_acquire(const detail::AcquireRequest& req, detail::Error& ec) override {
    return inner_->try_acquire(req, ec);
  }
  void cancel_acquire(std::string_view name, std::string_view owner) noexcept override {
    inner_->cancel_acquire(name, owner);
  }
  void renew(std::span<const detail::RenewItem> items, std::span<detail::RenewStatus> out,
             detail::Error& ec) override {
    inner_->renew(items, out, ec);
  }
  detail::ReleaseStatus release(std::string_view name, std::string_view owner, std::uint64_t token,
                                detail::Error& ec) override {
    return inner_->release(name, owner, token, ec);
  }
  void watch(std::string_view name, detail::Error& ec) override { inner_->watch(name, ec); }
  void unwatch(std::string_view name) noexcept override { inner_->unwatch(name); }
  LockInfo status(std::string_view name, detail::Error& ec) override { return inner_->status(name, ec); }
  std::string put_record(std::string_view key, std::string_view value, detail::PutMode mode,
                         detail::Error& ec) override {
    return inner_->put_record(key, value, mode, ec);
  }
  std::optional<std::string> get_record(std::string_view key, detail::Error& ec) override {
    return inner_->get_record(key, ec);
  }
  bool erase_record(std::string_view key, detail::Error& ec) override {
    return inner_->erase_record(key, ec);
  }
  std::vector<detail::ListedLock> list_held(std::string_view prefix, std::size_t limit, bool& truncated,
                                            detail::Error& ec) override {
    return inner_->list_held(prefix, limit, truncated, ec);
  }
  std::string url() const override { return inner_->url(); }

 protected:
  detail::ChangeListener* listener() const noexcept { return listener_; }

 private:
  std::unique_ptr<detail::Backend> inner_;
  detail::ChangeListener* listener_ = nullptr;
};

/// A memory:// backend of store `store_name`, made as connect() would make it.
inline std::unique_ptr<detail::Backend> memory_backend(const std::string& store_name,
                                                       const ClientOptions& opts) {
  detail::Url url;
  if (const detail::Error err = detail::parse_url("memory://" + store_name, url)) {
    throw std::system_error(err, err.detail());
  }
  detail::Error ec;
  auto backend = detail::make_memory_backend(url, opts, ec);
  if (ec) throw std::system_error(ec, ec.detail());
  return backend;
}

/// A client of the memory:// store `store_name` whose backend is a `Wrapper` (a ForwardingBackend)
/// around that store's backend, made as Wrapper(inner, args...), with `options`. `wrapper`, when
/// not null, is set to the wrapper, which the client's engine owns (it lives as long as the client).
template <class Wrapper, class... Args>
Client client_through(const std::string& store_name, const ClientOptions& options, Wrapper** wrapper,
                      Args&&... args) {
  auto backend = std::make_unique<Wrapper>(memory_backend(store_name, options), std::forward<Args>(args)...);
  if (wrapper) *wrapper = backend.get();
  return connect_with_engine(detail::Engine::create(std::move(backend), options));
}

}  // namespace distlock::testing
