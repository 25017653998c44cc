// Segment ids: the one thing a database does for SegmentGenerator (ids/segment.cpp) —
// take the next range of a tag's counter in one transaction.
//
// A database backend implements SegmentSource in its own folder (postgres/pg_segment.cpp,
// mysql/my_segment.cpp) and registers its factory under its URL schemes in
// connect/segment_registry.cpp (find_segment_source); the generator never includes a backend header.
//
// The table, one row per tag, in the URL's database (schema-qualified):
//   distlock_segments (tag, max_id BIGINT, step BIGINT, updated_at)
// A take is  max_id := max_id + s  with s = the requested step, or the row's `step` when
// none was requested, committed (durably) before the answer (the new max_id and s) is
// returned. A missing row is created by the first take with max_id = step = the step the
// generator gives for a new row (first range (0, s]). max_id never decreases, so ranges
// never overlap.
//
// A source only runs the statement and returns what the database said. Everything else —
// the step's bounds, a row step below 1, the range (max_id - s, max_id] and its overflow
// checks — is decided once, by the generator (ids/segment.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "distlock/options.hpp"
#include "engine/backend_error.hpp"

namespace distlock::detail {
struct Url;
}

namespace distlock::ids::detail {

/// What the database answered to one take: the row's max_id after it, and the step it
/// added (the requested one, or the row's `step` column when none was requested). Neither
/// is checked by the source.
struct SegmentTake {
  std::int64_t max_id = 0;
  std::int64_t step = 0;
};

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  /// Takes the next range of `tag` (1..128 bytes, checked by the caller): `step` > 0
  /// adds that many ids, 0 the row's step; a missing row is created with max_id = step =
  /// `new_row_step` (> 0). One round trip (plus a reconnect after a lost connection).
  /// Errors: backend_unavailable (no server, timeout), auth_failed (refused: a user that
  /// may not write the table), exhausted (max_id would pass 2^63 - 1), protocol_error
  /// (anything else, a malformed answer included); the error's detail names the problem
  /// and never the password. An answer whose commit was not confirmed is never returned (its range is
  /// never taken again by anyone: it is lost). A row step <= 0 must leave max_id as it is
  /// (never lowered) and is returned as it is, for the caller to refuse.
  virtual distlock::detail::Error take(const std::string& tag, std::int64_t step, std::int64_t new_row_step,
                                       SegmentTake& out) = 0;
  /// Where the rows live, for messages: the URL with its password masked and the table.
  virtual std::string describe() const = 0;
  /// Called in a child after fork(): drop the connection without telling the server (it
  /// is the parent's session), never use it again.
  virtual void abandon() noexcept = 0;
};

/// Opens a source for `url` (already checked against its scheme's query keys) and makes
/// sure the table exists (creating it when missing and allowed). On failure returns null
/// and fills `err` (invalid_url, auth_failed, backend_unavailable, invalid_argument, with
/// the sentence naming the cause).
using SegmentSourceFactory = std::unique_ptr<SegmentSource> (*)(const distlock::detail::Url& url,
                                                                Millis connect_timeout,
                                                                Millis command_timeout,
                                                                distlock::detail::Error& err);

}  // namespace distlock::ids::detail

namespace distlock::detail {
/// The segment source registered for `scheme` (connect/segment_registry.cpp), or nullptr.
ids::detail::SegmentSourceFactory find_segment_source(std::string_view scheme) noexcept;
/// The schemes that have one, comma-separated (for messages).
std::string segment_schemes();

/// The query keys of `url` checked against its scheme's entry, as a lock client's URL of that
/// scheme is (connect/segment_registry.cpp).
Error check_segment_url_query(const Url& url);
}  // namespace distlock::detail
