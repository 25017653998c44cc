#include "ids/worker_mark.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "api/client_access.hpp"
#include "distlock/error.hpp"
#include "engine/engine.hpp"
#include "engine/errno_text.hpp"
#include "engine/url.hpp"
#include "redis/connection.hpp"

namespace distlock::ids::detail {

bool apply_mark_op(MarkOp op, const MarkRecord& prior, std::uint64_t token, std::uint64_t nonce,
                   std::int64_t pos, MarkRecord& next) {
  if (op == MarkOp::claim) {
    if (prior.found && prior.token > token) return false;
    next = {true, token, nonce, prior.found ? std::max(prior.pos, pos) : pos};
    return true;
  }
  if (!prior.found || prior.token != token || prior.nonce != nonce) return false;
  next = prior;
  next.pos = op == MarkOp::extend ? std::max(prior.pos, pos) : pos;
  return true;
}

namespace {

// ---- memory:// ------------------------------------------------------------------------

class MemoryMarkStore final : public WorkerMarkStore {
 public:
  explicit MemoryMarkStore(std::string name) : name_(std::move(name)) {}

  bool apply(MarkOp op, const std::string& worker_lock, std::uint64_t token, std::uint64_t nonce,
             std::int64_t pos, MarkRecord& prior, distlock::detail::Error& /*err*/) override {
    static std::mutex mu;
    static std::map<std::string, MarkRecord> records;
    std::lock_guard lk(mu);
    MarkRecord& rec = records[name_ + '\n' + worker_lock];
    prior = rec;
    MarkRecord next;
    if (!apply_mark_op(op, prior, token, nonce, pos, next)) return false;
    rec = next;
    return true;
  }
  bool may_lose_records() const noexcept override { return false; }
  std::string describe() const override { return "memory://" + name_; }

 private:
  std::string name_;
};

// ---- file:// --------------------------------------------------------------------------

// "idmark." + the lock name with every byte outside [A-Za-z0-9._-] as %XX; a name too
// long for one path component is hashed (FNV-1a). Two names sharing a file would only
// make one generator stop (the record names its owner), never share ids.
std::string mark_file_name(std::string_view lock) {
  std::string out = "idmark.";
  for (const unsigned char c : lock) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  if (out.size() <= 200) return out;
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : lock) h = (h ^ c) * 1099511628211ull;
  return fmt::format("idmark.h{:016x}.{}", h, lock.size());
}

class FileMarkStore final : public WorkerMarkStore {
 public:
  explicit FileMarkStore(std::string dir) : dir_(std::move(dir)) {}

  bool apply(MarkOp op, const std::string& worker_lock, std::uint64_t token, std::uint64_t nonce,
             std::int64_t pos, MarkRecord& prior, distlock::detail::Error& err) override {
    const std::string path = dir_ + "/" + mark_file_name(worker_lock);
    const auto fail = [&](const char* what) {
      err.fail(errc::backend_unavailable, fmt::format("snowflake worker mark {}: {} failed: {}", path, what,
                                                      distlock::detail::errno_text(errno)));
      return false;
    };
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return fail("open");
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) return fail("fstat");
    if (st.st_uid != ::geteuid() && st.st_uid != 0) {
      err.fail(errc::invalid_argument,
               fmt::format("snowflake worker mark {} belongs to uid {}, not to this user ({}); refusing it",
                           path, st.st_uid, ::geteuid()));
      return false;
    }
    if (::flock(fd, LOCK_EX) != 0) return fail("flock");  // released by close
    std::array<char, 128> buf{};
    const ssize_t n = ::pread(fd, buf.data(), buf.size() - 1, 0);
    if (n < 0) return fail("read");
    prior = {};
    if (n > 0) {
      unsigned long long t = 0, nc = 0;
      long long ms = 0;
      if (std::sscanf(buf.data(), "%llu %llx %lld", &t, &nc, &ms) != 3 || ms < 0) {
        err.fail(errc::protocol_error,
                 fmt::format("snowflake worker mark {} is not \"<token> <nonce> <position>\"", path));
        return false;
      }
      prior = {true, t, nc, ms};
    }
    MarkRecord next;
    if (!apply_mark_op(op, prior, token, nonce, pos, next)) return false;
    const std::string text = fmt::format("{} {:x} {}\n", next.token, next.nonce, next.pos);
    if (::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) return fail("write");
    if (::ftruncate(fd, static_cast<off_t>(text.size())) != 0) return fail("ftruncate");
    if (::fdatasync(fd) != 0) return fail("fdatasync");
    return true;
  }
  bool may_lose_records() const noexcept override { return false; }
  std::string describe() const override { return "file://" + dir_; }

 private:
  std::string dir_;
};

// ---- redis:// -------------------------------------------------------------------------

namespace redis = distlock::detail::redis;

// KEYS[1] the mark hash; ARGV: op, token, nonce, position (decimal; nonce hex). Returns
// {applied 0/1, token, nonce, position} of the record before the call ("" when missing).
// Tokens and positions are compared as unsigned decimals (by length, then text), never
// as Lua doubles.
const redis::Script kMarkScript(R"lua(
local r = redis.call('HMGET', KEYS[1], 't', 'n', 'm')
local function lt(a, b) if #a ~= #b then return #a < #b end return a < b end
local prior = {r[1] or '', r[2] or '', r[3] or ''}
local m = ARGV[4]
if ARGV[1] == 'claim' then
  if r[1] and lt(ARGV[2], r[1]) then return {0, prior[1], prior[2], prior[3]} end
  if r[3] and lt(m, r[3]) then m = r[3] end
else
  if not r[1] or r[1] ~= ARGV[2] or r[2] ~= ARGV[3] then return {0, prior[1], prior[2], prior[3]} end
  if ARGV[1] == 'extend' and lt(m, r[3]) then m = r[3] end
end
redis.call('HSET', KEYS[1], 't', ARGV[2], 'n', ARGV[3], 'm', m)
return {1, prior[1], prior[2], prior[3]}
)lua");

class RedisMarkStore final : public WorkerMarkStore {
 public:
  RedisMarkStore(redis::ConnectionOptions co, std::string key_prefix)
      : conn_(std::move(co)), key_prefix_(std::move(key_prefix)) {}

  bool apply(MarkOp op, const std::string& worker_lock, std::uint64_t token, std::uint64_t nonce,
             std::int64_t pos, MarkRecord& prior, distlock::detail::Error& err) override {
    const std::string key = key_prefix_ + ":{" + worker_lock + "}:idmark";
    const char* op_name = op == MarkOp::claim ? "claim" : op == MarkOp::extend ? "extend" : "settle";
    const std::string t = std::to_string(token), n = fmt::format("{:x}", nonce), m = std::to_string(pos);
    std::lock_guard lk(mu_);
    redis::Reply reply;
    for (int attempt = 0; attempt < 2;
         ++attempt) {  // the first command after a restart meets the dead socket
      err.clear();
      reply = kMarkScript.run(conn_, {key}, {op_name, t, n, m}, err);
      if (err != errc::backend_unavailable) break;
    }
    if (err) {
      if (reply) {
        err.set_detail(fmt::format("{}: snowflake worker mark {}: {}", conn_.options().describe(), key,
                                   redis::reply_str(reply.get())));
      }
      return false;
    }
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 4 ||
        reply->element[0]->type != REDIS_REPLY_INTEGER) {
      err.fail(errc::protocol_error, fmt::format("{}: snowflake worker mark {}: unexpected reply",
                                                 conn_.options().describe(), key));
      return false;
    }
    prior = {};
    const std::string_view pt = redis::reply_str(reply->element[1]);
    if (!pt.empty()) {
      prior.found = true;
      const std::string_view pn = redis::reply_str(reply->element[2]);
      const std::string_view pm = redis::reply_str(reply->element[3]);
      const bool ok = std::from_chars(pt.data(), pt.data() + pt.size(), prior.token).ec == std::errc() &&
                      std::from_chars(pn.data(), pn.data() + pn.size(), prior.nonce, 16).ec == std::errc() &&
                      std::from_chars(pm.data(), pm.data() + pm.size(), prior.pos).ec == std::errc();
      if (!ok) {
        err.fail(errc::protocol_error, fmt::format("{}: snowflake worker mark {} holds a malformed record",
                                                   conn_.options().describe(), key));
        return false;
      }
    }
    return reply->element[0]->integer == 1;
  }
  bool may_lose_records() const noexcept override { return true; }
  std::string describe() const override { return conn_.options().describe(); }

 private:
  std::mutex mu_;
  redis::Connection conn_;
  std::string key_prefix_;
};

}  // namespace

std::unique_ptr<WorkerMarkStore> make_mark_store(const Client& client) {
  const std::string& text = distlock::detail::engine_of(client)->source_url();
  if (text.empty()) return nullptr;
  distlock::detail::Url url;
  if (const auto err = distlock::detail::parse_url(text, url)) throw_error(err, err.detail());
  if (url.scheme == "memory") {
    return std::make_unique<MemoryMarkStore>(url.hosts.empty() ? std::string("default")
                                                               : url.hosts.front().host);
  }
  if (url.scheme == "file") return std::make_unique<FileMarkStore>(url.path);
  if (url.scheme == "redis" || url.scheme == "rediss") {
    ClientOptions co = distlock::detail::engine_of(client)->options();
    distlock::detail::Error ec;
    redis::ConnectionOptions ro = redis::options_from_url(url, 0, co, ec);
    if (ec) throw_error(ec, ec.detail());
    auto store = std::make_unique<RedisMarkStore>(std::move(ro), url.query_or("prefix", "distlock"));
    return store;
  }
  return nullptr;
}

}  // namespace distlock::ids::detail
