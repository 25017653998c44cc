// Snowflake worker marks: a small record kept beside each worker-id lock, on the same
// lock service, holding the highest millisecond the worker id's holder may issue ids in.
//
// A generator that takes a worker id first *claims* its mark (reads the predecessor's
// mark and makes itself the record's owner), then issues only ids above that mark and
// at or below the mark it has reserved; it *extends* the mark (a reservation ahead of
// the clock) as time passes and *settles* it to its last issued millisecond when it
// lets the worker id go. A claim is refused when the record holds a larger fencing
// token than the claimer's (a stale holder); an extend or a settle only when the
// record still names the caller (its token and a random nonce), so an old holder
// whose worker id was taken over stops at its next extension.
//
// Stores: memory:// (process-wide map), file:// (one small file per worker id in the
// lock directory, read and written under its kernel lock), redis:// (a hash beside the
// lock, changed by one Lua script). Other schemes have none (make_mark_store returns
// nullptr) and the generator falls back to waiting out a margin (docs/ids.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include "distlock/client.hpp"
#include "engine/backend_error.hpp"

namespace distlock::ids::detail {

struct MarkRecord {
  bool found = false;
  std::uint64_t token = 0;
  std::uint64_t nonce = 0;
  /// The mark: unix_ms * 4096 + sequence (the position of a snowflake id in its worker's
  /// sequence, independent of the epoch).
  std::int64_t pos = 0;
};

enum class MarkOp {
  claim,   ///< refused if the record's token > ours; else {ours, max(old mark, pos)}
  extend,  ///< refused unless the record is ours; else mark = max(old mark, pos)
  settle,  ///< refused unless the record is ours; else mark = pos (may lower it)
};

/// What `op` does to `prior`: true and `next` filled when it is allowed.
bool apply_mark_op(MarkOp op, const MarkRecord& prior, std::uint64_t token, std::uint64_t nonce,
                   std::int64_t pos, MarkRecord& next);

class WorkerMarkStore {
 public:
  virtual ~WorkerMarkStore() = default;
  /// Applies `op` to the record of `worker_lock` atomically. Returns true when applied,
  /// false when refused (stale); `prior` receives the record as it was. On an I/O
  /// error returns false and fills `err` (errc::backend_unavailable, ...: the code and the
  /// sentence naming the record and the cause).
  virtual bool apply(MarkOp op, const std::string& worker_lock, std::uint64_t token, std::uint64_t nonce,
                     std::int64_t pos, MarkRecord& prior, distlock::detail::Error& err) = 0;
  /// True when a missing record may mean the store lost it (Redis without persistence,
  /// a flush, an eviction) rather than a worker id that was never used.
  virtual bool may_lose_records() const noexcept = 0;
  /// Where the records live, for messages (no password).
  virtual std::string describe() const = 0;
};

/// The store for `client`'s backend, or nullptr when the scheme has none.
std::unique_ptr<WorkerMarkStore> make_mark_store(const Client& client);

}  // namespace distlock::ids::detail
