// `distlock run --lock A --lock B`: several locks held as one `Hold`, so the runner's one code
// path (supervise, the loss wake-up, release) serves them as it serves one lock.
//
// MultiHold wraps a distlock::MultiLease (Client::acquire_all). It is an adapter of the CLI,
// not a public Hold: Hold's name() and token() speak of one name and one fencing token, which a
// set of names does not have, and a MultiLease handed to generic Hold code would be taken for
// one lock. What a member means here:
//   owns()              every name held (MultiLease::owns);
//   name()              the names, canonical order, joined by "," (for messages only);
//   token()/has_token() the one name's token when the set has exactly one name; with several,
//                       has_token() is false and token() throws errc::not_supported (the job
//                       gets every name's token in $DISTLOCK_TOKENS: tokens_env());
//   stop_token()        fires when any one name is lost;
//   on_lost(fn)         runs `fn` once when any one name is lost, on the thread that detected
//                       the loss (a stop callback), not on the client's event thread;
//   remaining()         the least time left of any name; max_hold_remaining() likewise;
//   loss_reason()/loss_detail()  of the first lost name, the detail naming it;
//   release()           releases every name (MultiLease::release).
//
// Thread-safety: as Hold: the const members from any thread at the same time; on_lost(),
// release() and moving belong to one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>

#include "distlock/hold.hpp"
#include "distlock/multi_lease.hpp"

namespace distlock::cli::run {

class MultiHold final : public Hold {
 public:
  explicit MultiHold(MultiLease multi);
  ~MultiHold() override;
  MultiHold(const MultiHold&) = delete;
  MultiHold& operator=(const MultiHold&) = delete;

  bool owns() const noexcept override;
  const std::string& name() const noexcept override;
  std::uint64_t token() const override;
  bool has_token() const noexcept override;
  std::stop_token stop_token() const noexcept override;
  void on_lost(std::function<void()> fn) override;
  Millis remaining() const noexcept override;
  std::optional<Millis> max_hold_remaining() const noexcept override;
  LossReason loss_reason() const noexcept override;
  std::string loss_detail() const override;
  void release() override;
  void release(std::error_code& ec) noexcept override;

  const MultiLease& multi() const noexcept { return multi_; }
  /// "DISTLOCK_TOKENS=a=1,b=2": each name=token in the canonical order, "-" for a name
  /// without a token (Redlock), as the shard runner writes "-".
  std::string tokens_env() const;

 private:
  /// The first lost lease, or null.
  const Lease* lost_lease() const noexcept;

  MultiLease multi_;
  std::string label_;
  std::list<std::stop_callback<std::function<void()>>> on_lost_;
};

}  // namespace distlock::cli::run
