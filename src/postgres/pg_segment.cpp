// Segment ids on postgres:// (ids/segment_source.hpp): the table
// public.distlock_segments and the one statement that takes a range.
#include "postgres/pg_segment.hpp"

#include <fmt/format.h>

#include <charconv>

#include "distlock/error.hpp"
#include "engine/url.hpp"
#include "postgres/pg_conn.hpp"
#include "postgres/postgres_backend.hpp"

namespace distlock::detail::pg {

namespace {

constexpr const char* kTable = "public.distlock_segments";

// Schema-qualified, like the lock table: a user's search_path cannot split it.
constexpr const char* kCreateSql =
    "CREATE TABLE IF NOT EXISTS public.distlock_segments (tag text PRIMARY KEY,"
    " max_id bigint NOT NULL, step bigint NOT NULL, updated_at timestamptz)";

// $1 tag, $2 the step of a new row, $3 the requested step (0: the row's). One
// statement, so one transaction: the row is locked, max_id moved and committed
// (synchronous_commit = on, set by open()) before the answer is returned. bigint
// overflow is SQLSTATE 22003 (nothing changes). A row step <= 0 (an administrator's
// mistake) leaves max_id as it is (never lowered: other generators' ranges would
// repeat); the step is returned as it is and refused by the generator (ids/segment.cpp).
constexpr const char* kTakeSql =
    "INSERT INTO public.distlock_segments AS s (tag, max_id, step, updated_at)"
    " VALUES ($1, $2::bigint, $2::bigint, clock_timestamp())"
    " ON CONFLICT (tag) DO UPDATE"
    " SET max_id = s.max_id + GREATEST(COALESCE(NULLIF($3::bigint, 0), s.step), 0),"
    " updated_at = clock_timestamp()"
    " RETURNING max_id, COALESCE(NULLIF($3::bigint, 0), s.step)";

bool to_i64(const char* text, std::int64_t& v) {
  const std::string_view s(text);
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

class PgSegmentSource final : public ids::detail::SegmentSource {
 public:
  explicit PgSegmentSource(Config cfg) : cfg_(std::move(cfg)) {}

  Error open() {
    Error err;
    conn_ = pg::open(cfg_, Millis(0), "distlock-segment", err);
    if (!conn_) return err;
    Exec e = run(conn_.get(), "SELECT to_regclass('public.distlock_segments') IS NOT NULL", {},
                 cfg_.command_timeout);
    if (e.ok() && PQntuples(e.res.get()) == 1 && PQgetvalue(e.res.get(), 0, 0) == std::string_view("t")) {
      return {};
    }
    if (e.ok()) {
      // Many clients may start at once: CREATE TABLE IF NOT EXISTS races on the catalog,
      // so it runs under a transaction-level advisory lock (two-int key space, away from
      // the lock names' bigint keys).
      for (const char* sql : {"BEGIN", "SELECT pg_advisory_xact_lock(1684632419, 3)", kCreateSql, "COMMIT"}) {
        e = run(conn_.get(), sql, {}, cfg_.command_timeout);
        if (!e.ok()) break;
      }
    }
    if (!e.ok()) {
      conn_.reset();
      return {code_of(e), scrub_secrets(fmt::format("{}: cannot create or read the table {}: {}", cfg_.shown,
                                                    kTable, e.error),
                                        cfg_.url)};
    }
    return {};
  }

  Error take(const std::string& tag, std::int64_t step, std::int64_t new_row_step,
             ids::detail::SegmentTake& out) override {
    const std::vector<std::string> params{tag, std::to_string(new_row_step), std::to_string(step)};
    Exec e;
    // One retry on a fresh connection after a lost one (a server restart): a range whose
    // commit was not confirmed is simply never used.
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!conn_) {
        if (auto err = open()) return err;
      }
      e = run(conn_.get(), kTakeSql, params, cfg_.command_timeout);
      if (!e.io_failed) break;
      conn_.reset();
    }
    if (!e.ok()) {
      const std::error_code ec = e.sqlstate == "22003" ? make_error_code(errc::exhausted) : code_of(e);
      return {ec, scrub_secrets(fmt::format("{}: cannot take a range of segment \"{}\" from {}: {}",
                                            cfg_.shown, tag, kTable, e.error),
                                cfg_.url)};
    }
    if (PQntuples(e.res.get()) != 1 || PQnfields(e.res.get()) != 2 ||
        !to_i64(PQgetvalue(e.res.get(), 0, 0), out.max_id) ||
        !to_i64(PQgetvalue(e.res.get(), 0, 1), out.step)) {
      return {make_error_code(errc::protocol_error),
              fmt::format("{}: the range of segment \"{}\" came back malformed", cfg_.shown, tag)};
    }
    return {};
  }

  std::string describe() const override { return cfg_.shown + " (" + kTable + ")"; }

  void abandon() noexcept override {
    // PQfinish would send a Terminate message on the parent's socket.
    (void)conn_.release();
  }

 private:
  Config cfg_;
  Conn conn_;
};

}  // namespace

std::unique_ptr<ids::detail::SegmentSource> make_segment_source(const Url& url, Millis connect_timeout,
                                                                Millis command_timeout, Error& err) {
  ClientOptions opts;
  opts.connect_timeout = connect_timeout;
  opts.command_timeout = command_timeout;
  Config cfg;
  if ((err = postgres_config(url, opts, cfg))) return nullptr;
  auto source = std::make_unique<PgSegmentSource>(std::move(cfg));
  if ((err = source->open())) return nullptr;
  return source;
}

}  // namespace distlock::detail::pg
