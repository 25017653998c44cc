// RedisFence: fenced writes to Redis-stored resources. Each write is one Lua script,
// run with EVALSHA on the Redis backend's connection pool, that
//   1. reads the resource's fence key (the highest token it has seen),
//   2. returns {0, seen} without touching anything when the caller's token is smaller,
//   3. otherwise records the token and performs the write, returning {1, token, ...}.
// Redis runs a script atomically, so no other write can fall between the check and
// the write. Tokens travel as decimal strings and are compared by length, then
// lexicographically: exact for the whole uint64 range (Lua numbers are doubles).
#include <charconv>
#include <map>
#include <mutex>
#include <string>

#include "distlock/fencing.hpp"
#include "engine/scheme.hpp"
#include "engine/thread_annotations.hpp"
#include "engine/url.hpp"
#include "redis/connection.hpp"
#include "redis/redis_scheme.hpp"

namespace distlock {

namespace r = detail::redis;

namespace {

// Shared by every script: the fence check and the record. KEYS/ARGV positions are
// passed in so the user's body in eval() keeps its own KEYS[1..n] and ARGV[1..m].
constexpr std::string_view kPrelude = R"lua(
local function distlock_fence_check(fence_key, token)
  local seen = redis.call('GET', fence_key)
  if seen and (#token < #seen or (#token == #seen and token < seen)) then
    return false, seen
  end
  return true, seen
end
local function distlock_fence_record(fence_key, token, seen)
  if seen ~= token then redis.call('SET', fence_key, token) end
end
)lua";

// KEYS: data, fence. ARGV: token, value.
constexpr std::string_view kSet = R"lua(
local ok, seen = distlock_fence_check(KEYS[2], ARGV[1])
if not ok then return {0, seen} end
distlock_fence_record(KEYS[2], ARGV[1], seen)
redis.call('SET', KEYS[1], ARGV[2])
return {1, ARGV[1]}
)lua";

// KEYS: data, fence. ARGV: token, field, value. The key's type is checked before
// the fence moves (HSET on a string fails, and a script is not rolled back).
constexpr std::string_view kHset = R"lua(
local ok, seen = distlock_fence_check(KEYS[2], ARGV[1])
if not ok then return {0, seen} end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. kind .. ', not a hash')
end
distlock_fence_record(KEYS[2], ARGV[1], seen)
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return {1, ARGV[1]}
)lua";

// KEYS: data, fence. ARGV: token. Returns {1, token, decremented 0|1, value}.
// Every check comes before any write: the fence, then the value exactly as DECR
// parses it (Redis's string2ll: "0", or an optional '-' and digits without a
// leading zero, within int64 — Lua's tonumber would accept "007", "+5", "1e3" or
// 2^63, which DECR then refuses after the fence had moved). Only then the fence
// is recorded and the value decremented. The value travels back as a decimal
// string (exact beyond 2^53, where Lua numbers are not).
constexpr std::string_view kDecrement = R"lua(
local ok, seen = distlock_fence_check(KEYS[2], ARGV[1])
if not ok then return {0, seen} end
local raw = redis.call('GET', KEYS[1])
local positive = false
if raw then
  local neg, digits = string.match(raw, '^(%-?)([1-9]%d*)$')
  if raw ~= '0' and (digits == nil or #digits > 19 or
      (#digits == 19 and digits > (neg == '-' and '9223372036854775808' or '9223372036854775807'))) then
    return redis.error_reply('value of ' .. KEYS[1] .. ' is not an integer (or out of range)')
  end
  positive = digits ~= nil and neg == ''
end
distlock_fence_record(KEYS[2], ARGV[1], seen)
if positive then
  redis.call('DECR', KEYS[1])
  return {1, ARGV[1], 1, redis.call('GET', KEYS[1])}
end
return {1, ARGV[1], 0, raw or '0'}
)lua";

// The user's body becomes a local function with its own KEYS and ARGV (without the
// fence key and token, which the wrapper appends last). Returns {1, token, body()}.
std::string wrap_body(std::string_view body) {
  std::string s(kPrelude);
  s += R"lua(
local distlock_fence_key = KEYS[#KEYS]
local distlock_token = ARGV[#ARGV]
local ok, seen = distlock_fence_check(distlock_fence_key, distlock_token)
if not ok then return {0, seen} end
distlock_fence_record(distlock_fence_key, distlock_token, seen)
local user_keys, user_args = {}, {}
for i = 1, #KEYS - 1 do user_keys[i] = KEYS[i] end
for i = 1, #ARGV - 1 do user_args[i] = ARGV[i] end
local function distlock_body(KEYS, ARGV)
)lua";
  s += body;
  s += "\nend\nreturn {1, distlock_token, distlock_body(user_keys, user_args)}\n";
  return s;
}

const r::Script& builtin(std::string_view body) {
  static const r::Script& set_script = *new r::Script(std::string(kPrelude) + std::string(kSet));
  static const r::Script& hset_script = *new r::Script(std::string(kPrelude) + std::string(kHset));
  static const r::Script& decr_script = *new r::Script(std::string(kPrelude) + std::string(kDecrement));
  if (body == kSet) return set_script;
  if (body == kHset) return hset_script;
  return decr_script;
}

RedisValue to_value(const redisReply* rep) {
  RedisValue v;
  if (rep == nullptr) return v;
  switch (rep->type) {
    case REDIS_REPLY_INTEGER:
      v.type = RedisValue::Type::integer;
      v.integer = rep->integer;
      break;
    case REDIS_REPLY_STRING:
      v.type = RedisValue::Type::string;
      v.str.assign(rep->str, rep->len);
      break;
    case REDIS_REPLY_STATUS:
      v.type = RedisValue::Type::status;
      v.str.assign(rep->str, rep->len);
      break;
    case REDIS_REPLY_ARRAY:
      v.type = RedisValue::Type::array;
      for (std::size_t i = 0; i < rep->elements; ++i) v.elements.push_back(to_value(rep->element[i]));
      break;
    case REDIS_REPLY_ERROR:
      throw_error(make_error_code(errc::protocol_error),
                  "fenced script returned an error: " + std::string(rep->str, rep->len));
    default: break;  // nil
  }
  return v;
}

std::uint64_t parse_token(const redisReply* rep, const std::string& who) {
  std::uint64_t v = 0;
  if (rep != nullptr && rep->type == REDIS_REPLY_STRING) {
    const auto [end, ec] = std::from_chars(rep->str, rep->str + rep->len, v);
    if (ec == std::errc() && end == rep->str + rep->len) return v;
  }
  throw_error(make_error_code(errc::protocol_error),
              who + ": fence key does not hold a token (" +
                  (rep && rep->type == REDIS_REPLY_STRING ? std::string(rep->str, rep->len) : "?") + ")");
}

template <class Result, class F>
Result no_throw(std::error_code& ec, F&& f) noexcept {
  ec.clear();
  try {
    return f();
  } catch (const std::system_error& e) {
    ec = e.code();
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    ec = make_error_code(errc::protocol_error);
  }
  return Result{};
}

}  // namespace

struct RedisFence::Impl {
  Impl(r::ConnectionOptions o, std::string redacted) : pool(std::move(o)), url(std::move(redacted)) {}

  r::PooledConnection checkout() {
    detail::Error ec;
    auto conn = pool.checkout(ec);
    if (ec) throw_error(ec, "fenced write: " + ec.detail());
    return conn;
  }

  [[noreturn]] void fail(const detail::Error& ec, const redisReply* rep, std::string_view what,
                         std::string_view note = {}) {
    std::string msg = std::string(what) + " on " + url + ": ";
    const bool server_error = rep != nullptr && rep->type == REDIS_REPLY_ERROR;
    msg += server_error ? std::string(r::reply_str(rep)) : ec.detail();
    if (server_error) msg += note;  // a transport failure says nothing about the script's progress
    throw_error(ec, msg);
  }

  /// Runs `script` with the user keys plus fence key and args plus token; returns
  /// the reply, whose first two elements have been checked.
  r::Reply run(const r::Script& script, std::vector<std::string_view> keys,
               std::vector<std::string_view> args, std::string_view what, std::string_view note = {}) {
    auto conn = checkout();
    detail::Error ec;
    r::Reply rep = script.run(*conn, keys, args, ec);
    if (ec) fail(ec, rep.get(), what, note);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 2 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER) {
      throw_error(make_error_code(errc::protocol_error),
                  std::string(what) + " on " + url + ": unexpected reply from the fence script");
    }
    return rep;
  }

  FenceResult head(const redisReply* rep, std::string_view what) {
    FenceResult res;
    res.status = rep->element[0]->integer == 1 ? FenceStatus::applied : FenceStatus::stale;
    res.highest_token = parse_token(rep->element[1], std::string(what));
    return res;
  }

  std::shared_ptr<r::Script> script_for(std::string_view body) {
    detail::LockGuard lk(mu);
    auto it = user_scripts.find(body);
    if (it != user_scripts.end()) return it->second;
    // Bounded: a program that builds bodies dynamically must not grow this forever.
    if (user_scripts.size() >= 256) user_scripts.clear();
    auto s = std::make_shared<r::Script>(wrap_body(body));
    user_scripts.emplace(std::string(body), s);
    return s;
  }

  r::ConnectionPool pool;
  std::string url;
  detail::AnnotatedMutex mu;
  std::map<std::string, std::shared_ptr<r::Script>, std::less<>> user_scripts DISTLOCK_GUARDED_BY(mu);
};

RedisFence::RedisFence(std::string_view url_text, const ClientOptions& in_opts) {
  detail::Url url;
  if (const auto err = detail::parse_url(url_text, url)) throw_error(err, err.detail());
  if (url.scheme != "redis" && url.scheme != "rediss") {
    throw_error(make_error_code(errc::invalid_url),
                "RedisFence needs a redis:// URL (or rediss://), got scheme \"" + url.scheme + "\" in " +
                    url.redacted());
  }
  if (url.hosts.size() != 1) {
    throw_error(make_error_code(errc::invalid_url), "RedisFence needs exactly one host in " + url.redacted());
  }
  // The same query keys as a lock client's redis:// URL, checked by the same table.
  if (const auto err = detail::check_query(*detail::scheme_named(detail::redis_schemes(), url.scheme), url)) {
    throw_error(err, err.detail());
  }
  ClientOptions opts = in_opts;
  if (const auto err = detail::apply_common_query(url, opts)) throw_error(err, err.detail());
  detail::Error ec;
  r::ConnectionOptions co = r::options_from_url(url, 0, opts, ec);
  if (ec) throw_error(ec, ec.detail());
  impl_ = std::make_unique<Impl>(std::move(co), url.redacted());
}

RedisFence::~RedisFence() = default;
RedisFence::RedisFence(RedisFence&&) noexcept = default;
RedisFence& RedisFence::operator=(RedisFence&&) noexcept = default;

std::string RedisFence::url() const {
  return impl_->url;
}

namespace {
std::string token_text(std::uint64_t token) {
  return std::to_string(token);
}
}  // namespace

FenceResult RedisFence::set(std::string_view key, std::string_view value, std::uint64_t token) {
  const std::string fence = fence_key_for(key), tok = token_text(token);
  r::Reply rep = impl_->run(builtin(kSet), {key, fence}, {tok, value}, "fenced SET");
  return impl_->head(rep.get(), "fenced SET");
}

FenceResult RedisFence::hset(std::string_view key, std::string_view field, std::string_view value,
                             std::uint64_t token) {
  const std::string fence = fence_key_for(key), tok = token_text(token);
  r::Reply rep = impl_->run(builtin(kHset), {key, fence}, {tok, field, value}, "fenced HSET");
  return impl_->head(rep.get(), "fenced HSET");
}

DecrementResult RedisFence::decrement_if_positive(std::string_view key, std::uint64_t token) {
  const std::string fence = fence_key_for(key), tok = token_text(token);
  r::Reply rep = impl_->run(builtin(kDecrement), {key, fence}, {tok}, "fenced decrement");
  DecrementResult res;
  static_cast<FenceResult&>(res) = impl_->head(rep.get(), "fenced decrement");
  if (res.applied()) {
    std::int64_t value = 0;
    const std::string_view text = rep->elements >= 4 && rep->element[3]->type == REDIS_REPLY_STRING
                                      ? r::reply_str(rep->element[3])
                                      : "";
    const auto [end, perr] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (rep->elements < 4 || rep->element[2]->type != REDIS_REPLY_INTEGER || text.empty() ||
        perr != std::errc() || end != text.data() + text.size()) {
      throw_error(make_error_code(errc::protocol_error),
                  "fenced decrement: unexpected reply on " + impl_->url);
    }
    res.decremented = rep->element[2]->integer == 1;
    res.value = value;
  }
  return res;
}

ScriptResult RedisFence::eval(std::string_view body, const std::vector<std::string>& keys,
                              const std::vector<std::string>& args, std::uint64_t token) {
  if (keys.empty()) {
    throw_error(make_error_code(errc::invalid_argument),
                "fenced eval needs at least one key (the fence follows keys[0])");
  }
  if (body.empty())
    throw_error(make_error_code(errc::invalid_argument), "fenced eval: the Lua body is empty");
  const std::string fence = fence_key_for(keys[0]), tok = token_text(token);
  std::vector<std::string_view> k(keys.begin(), keys.end()), a(args.begin(), args.end());
  k.push_back(fence);
  a.push_back(tok);
  auto script = impl_->script_for(body);
  r::Reply rep = impl_->run(*script, std::move(k), std::move(a), "fenced eval",
                            " (a script is not rolled back: if the token passed the fence check, the fence "
                            "records it and whatever the body wrote before the error stays)");
  ScriptResult res;
  static_cast<FenceResult&>(res) = impl_->head(rep.get(), "fenced eval");
  if (res.applied() && rep->elements >= 3) res.reply = to_value(rep->element[2]);
  return res;
}

std::uint64_t RedisFence::highest_token(std::string_view key) {
  const std::string fence = fence_key_for(key);
  auto conn = impl_->checkout();
  detail::Error ec;
  r::Reply rep = conn->command({"GET", fence}, ec);
  if (ec) impl_->fail(ec, rep.get(), "reading the fence");
  if (rep->type == REDIS_REPLY_NIL) return 0;
  return parse_token(rep.get(), "reading the fence of " + std::string(key));
}

std::optional<std::string> RedisFence::get(std::string_view key) {
  auto conn = impl_->checkout();
  detail::Error ec;
  r::Reply rep = conn->command({"GET", key}, ec);
  if (ec) impl_->fail(ec, rep.get(), "GET");
  if (rep->type == REDIS_REPLY_NIL) return std::nullopt;
  return std::string(r::reply_str(rep.get()));
}

void RedisFence::reset(std::string_view key) {
  const std::string fence = fence_key_for(key);
  auto conn = impl_->checkout();
  detail::Error ec;
  r::Reply rep = conn->command({"DEL", key, fence}, ec);
  if (ec) impl_->fail(ec, rep.get(), "DEL");
}

RedisValue RedisFence::command(const std::vector<std::string>& argv) {
  if (argv.empty()) throw_error(make_error_code(errc::invalid_argument), "empty Redis command");
  std::vector<std::string_view> a(argv.begin(), argv.end());
  auto conn = impl_->checkout();
  detail::Error ec;
  r::Reply rep = conn->command(a, ec);
  if (ec) impl_->fail(ec, rep.get(), argv[0]);
  return to_value(rep.get());
}

// ---- error_code overloads ---------------------------------------------------

FenceResult RedisFence::set(std::string_view key, std::string_view value, std::uint64_t token,
                            std::error_code& ec) noexcept {
  return no_throw<FenceResult>(ec, [&] { return set(key, value, token); });
}

FenceResult RedisFence::hset(std::string_view key, std::string_view field, std::string_view value,
                             std::uint64_t token, std::error_code& ec) noexcept {
  return no_throw<FenceResult>(ec, [&] { return hset(key, field, value, token); });
}

DecrementResult RedisFence::decrement_if_positive(std::string_view key, std::uint64_t token,
                                                  std::error_code& ec) noexcept {
  return no_throw<DecrementResult>(ec, [&] { return decrement_if_positive(key, token); });
}

ScriptResult RedisFence::eval(std::string_view body, const std::vector<std::string>& keys,
                              const std::vector<std::string>& args, std::uint64_t token,
                              std::error_code& ec) noexcept {
  return no_throw<ScriptResult>(ec, [&] { return eval(body, keys, args, token); });
}

}  // namespace distlock
