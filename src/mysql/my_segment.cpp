// Segment ids on mysql:// (ids/segment_source.hpp): the InnoDB table
// `database`.`distlock_segments` and the one transaction that takes a range.
#include "mysql/my_segment.hpp"

#include <fmt/format.h>

#include <charconv>

#include "distlock/error.hpp"
#include "engine/url.hpp"
#include "mysql/my_conn.hpp"
#include "mysql/mysql_backend.hpp"

namespace distlock::detail::my {

namespace {

bool to_i64(const std::optional<std::string>& text, std::int64_t& v) {
  if (!text) return false;
  const auto r = std::from_chars(text->data(), text->data() + text->size(), v);
  return r.ec == std::errc() && r.ptr == text->data() + text->size();
}

class MySegmentSource final : public ids::detail::SegmentSource {
 public:
  explicit MySegmentSource(Config cfg)
      : cfg_(std::move(cfg)), table_(quote_ident(cfg_.database) + ".`distlock_segments`") {}

  Error open() {
    Error err;
    conn_ = my::open(cfg_, err);
    if (!conn_) return err;
    Exec e = run(conn_.get(), "SELECT 1 FROM " + table_ + " LIMIT 0");
    if (!e.ok() && e.errnum == 1146 /* ER_NO_SUCH_TABLE */) {
      e = run(conn_.get(), "CREATE TABLE IF NOT EXISTS " + table_ +
                               " (tag VARBINARY(128) NOT NULL PRIMARY KEY, max_id BIGINT NOT NULL,"
                               " step BIGINT NOT NULL, updated_at DATETIME(6) NULL) ENGINE=InnoDB");
    }
    if (!e.ok()) {
      conn_.reset();
      return {code_of(e),
              fmt::format("{}: cannot create or read the table {}: {}", cfg_.shown, table_, e.error)};
    }
    return {};
  }

  Error take(const std::string& tag, std::int64_t step, std::int64_t new_row_step,
             ids::detail::SegmentTake& out) override {
    // One batch, one round trip, one transaction: the INSERT ... ON DUPLICATE KEY UPDATE
    // locks the row and moves max_id; the SELECT (same transaction) reads what it wrote;
    // COMMIT makes it durable (with innodb_flush_log_at_trx_commit = 1, the server's
    // default, assumed here) before the answer comes back. BIGINT overflow is error 1690
    // and changes nothing. A row step <= 0 (an administrator's mistake) leaves max_id as
    // it is (never lowered: other generators' ranges would repeat); the step is returned
    // as it is and refused by the generator (ids/segment.cpp). The SELECT returns the
    // step the take added: the requested one, or the row's. Every value is a hex literal
    // or a number built here.
    const std::string key = hex_literal(tag);
    const std::string fresh = std::to_string(new_row_step);
    const std::string add = step > 0 ? std::to_string(step) : std::string("GREATEST(step, 0)");
    const std::string used = step > 0 ? std::to_string(step) : std::string("step");
    const std::string sql = "START TRANSACTION; INSERT INTO " + table_ +
                            " (tag, max_id, step, updated_at) VALUES (" + key + ", " + fresh + ", " + fresh +
                            ", NOW(6)) ON DUPLICATE KEY UPDATE max_id = max_id + " + add +
                            ", updated_at = NOW(6); SELECT max_id, " + used + " FROM " + table_ +
                            " WHERE tag = " + key + "; COMMIT";
    Exec e;
    // One retry on a fresh connection after a lost one (a server restart): a range whose
    // commit was not confirmed is simply never used. Generators creating the same row at
    // once may deadlock on its gap lock (InnoDB picks a victim, error 1213): the victim
    // tries again, at most 4 times in all.
    for (int attempt = 0, lost = 0; attempt < 4; ++attempt) {
      if (!conn_) {
        if (auto err = open()) return err;
      }
      e = run(conn_.get(), sql);
      if (e.io_failed) {
        conn_.reset();
        if (++lost == 2) break;
        continue;
      }
      if (e.errnum != 1213 /* ER_LOCK_DEADLOCK */) break;
      run(conn_.get(), "ROLLBACK");
    }
    if (!e.ok()) {
      if (!e.io_failed && conn_) run(conn_.get(), "ROLLBACK");  // the batch stopped inside its transaction
      const std::error_code ec =
          e.errnum == 1690 /* ER_DATA_OUT_OF_RANGE */ ? make_error_code(errc::exhausted) : code_of(e);
      return {ec, fmt::format("{}: cannot take a range of segment \"{}\" from {}: {}", cfg_.shown, tag,
                              table_, e.error)};
    }
    if (e.rows.size() != 1 || e.rows[0].size() != 2 || !to_i64(e.rows[0][0], out.max_id) ||
        !to_i64(e.rows[0][1], out.step)) {
      return {make_error_code(errc::protocol_error),
              fmt::format("{}: the range of segment \"{}\" came back malformed", cfg_.shown, tag)};
    }
    return {};
  }

  std::string describe() const override { return cfg_.shown + " (" + table_ + ")"; }

  void abandon() noexcept override {
    // mysql_close would send COM_QUIT on the parent's socket.
    (void)conn_.release();
  }

 private:
  Config cfg_;
  std::string table_;
  Conn conn_;
};

}  // namespace

std::unique_ptr<ids::detail::SegmentSource> make_segment_source(const Url& url, Millis connect_timeout,
                                                                Millis command_timeout, Error& err) {
  ClientOptions opts;
  opts.connect_timeout = connect_timeout;
  opts.command_timeout = command_timeout;
  Config cfg;
  if ((err = mysql_config(url, opts, cfg))) return nullptr;
  auto source = std::make_unique<MySegmentSource>(std::move(cfg));
  if ((err = source->open())) return nullptr;
  return source;
}

}  // namespace distlock::detail::my
