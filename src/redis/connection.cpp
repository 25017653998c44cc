#include "redis/connection.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <new>

#include "engine/errno_text.hpp"

namespace distlock::detail::redis {

namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

// ---- options -----------------------------------------------------------------

std::string ConnectionOptions::describe() const {
  const bool v6 = host.find(':') != std::string::npos;
  return "redis " + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Error parse_db_path(const Url& url, int& db) {
  db = 0;
  if (url.path.empty() || url.path == "/") return {};
  const std::string_view digits = std::string_view(url.path).substr(1);
  int v = -1;
  auto [p, e] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (e != std::errc{} || p != digits.data() + digits.size() || v < 0 || v > 9999) {
    return {make_error_code(errc::invalid_url),
            "database \"" + url.path + "\" in URL \"" + url.redacted() +
                "\" is not a database number (expected /0 ... /15 or another non-negative number)"};
  }
  db = v;
  return {};
}

ConnectionOptions options_from_url(const Url& url, std::size_t host_index, const ClientOptions& client,
                                   Error& err) {
  ConnectionOptions o;
  err.clear();
  if (host_index >= url.hosts.size()) {
    err.fail(errc::invalid_url, "URL \"" + url.redacted() + "\" names no host");
    return o;
  }
  o.host = url.hosts[host_index].host;
  o.port = url.hosts[host_index].port != 0 ? url.hosts[host_index].port : 6379;
  o.user = url.user;
  o.password = url.password;
  o.connect_timeout = client.connect_timeout;
  o.command_timeout = client.command_timeout;
  if ((err = parse_db_path(url, o.db))) return o;
  if (url.scheme == "rediss" || url.scheme.rfind("rediss+", 0) == 0 || url.scheme == "redlocks") {
    o.tls.enabled = true;
    o.tls.ca_file = url.query_or("cacert", "");
    o.tls.cert_file = url.query_or("cert", "");
    o.tls.key_file = url.query_or("key", "");
    for (const auto& [param, file] : {std::pair{"cacert", o.tls.ca_file}, std::pair{"cert", o.tls.cert_file},
                                      std::pair{"key", o.tls.key_file}}) {
      if (!file.empty() && ::access(file.c_str(), R_OK) != 0) {
        err.fail(errc::invalid_url, std::string(param) + "=\"" + file + "\" in URL \"" + url.redacted() +
                                        "\" cannot be read: " + errno_text(errno));
        return o;
      }
    }
    if (!o.tls.key_file.empty() && o.tls.cert_file.empty()) {
      err.fail(errc::invalid_url, "URL \"" + url.redacted() +
                                      "\" has key= without cert= (the key belongs to a client certificate)");
      return o;
    }
  }
  if (!o.user.empty() && o.password.empty()) {
    // The user part is not quoted: people write a bare password there (redis://PASSWORD@h).
    err.fail(
        errc::invalid_url,
        "URL \"" + url.redacted() +
            "\" names a user but no password (write user:password@, or :password@ for the default user)");
  }
  return o;
}

// ---- replies -------------------------------------------------------------------

std::string_view reply_str(const redisReply* r) noexcept {
  if (r == nullptr || r->str == nullptr) return {};
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR: return {r->str, r->len};
    default: return {};
  }
}

bool is_error(const redisReply* r, std::string_view prefix) noexcept {
  return r != nullptr && r->type == REDIS_REPLY_ERROR && starts_with(reply_str(r), prefix);
}

std::error_code error_code_of(const redisReply* r) noexcept {
  if (r == nullptr || r->type != REDIS_REPLY_ERROR) return {};
  const std::string_view s = reply_str(r);
  for (std::string_view p : {"NOAUTH", "WRONGPASS", "NOPERM", "ERR invalid password", "ERR AUTH"}) {
    if (starts_with(s, p)) return make_error_code(errc::auth_failed);
  }
  for (std::string_view p : {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "READONLY", "CLUSTERDOWN",
                             "ERR max number of clients"}) {
    if (starts_with(s, p)) return make_error_code(errc::backend_unavailable);
  }
  return make_error_code(errc::protocol_error);
}

bool to_u64(const redisReply* r, std::uint64_t& out) noexcept {
  if (r == nullptr) return false;
  if (r->type == REDIS_REPLY_INTEGER) {
    if (r->integer < 0) return false;
    out = static_cast<std::uint64_t>(r->integer);
    return true;
  }
  const std::string_view s = reply_str(r);
  if (r->type != REDIS_REPLY_STRING || s.empty()) return false;
  std::uint64_t v = 0;
  auto [p, e] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (e != std::errc{} || p != s.data() + s.size()) return false;
  out = v;
  return true;
}

// ---- Connection ----------------------------------------------------------------

bool format_command(std::string& out, std::span<const std::string_view> argv) {
  ArgvArrays args(argv);
  char* cmd = nullptr;
  const int n = redisFormatCommandArgv(&cmd, args.argc(), args.ptrs(), args.lens());
  if (n < 0 || cmd == nullptr) return false;
  out.append(cmd, static_cast<std::size_t>(n));
  redisFreeCommand(cmd);
  return true;
}

Connection::Connection(ConnectionOptions opts) : opts_(std::move(opts)) {}

void Connection::connect(Error& ec) {
  ec.clear();
  if (sock_) return;
  pending_ = 0;
  obuf_.clear();
  sock_ = open_socket(opts_, ec);
  if (ec) return;
  reader_ = make_reader();
  if (!reader_) {
    sock_.reset();
    ec.fail(errc::backend_unavailable, opts_.describe() + ": out of memory");
  }
}

void Connection::close() noexcept {
  sock_.reset();
  reader_.reset();
  obuf_.clear();
  pending_ = 0;
  pending_connect_failed_ = false;
}

void Connection::fail_io(Error& ec, std::string_view during, const std::string& cause) {
  ec.fail(errc::backend_unavailable, opts_.describe() + ": " + std::string(during) + " failed: " + cause);
  // After an I/O error or a timeout the reply stream is out of step: start afresh.
  close();
}

void Connection::fail_reply(const redisReply* r, Error& ec) const {
  ec.fail(error_code_of(r), opts_.describe() + " answered: " + std::string(reply_str(r)));
}

Reply Connection::command(std::span<const std::string_view> argv, Error& ec) {
  ec.clear();
  if (pending_ != 0) {
    // A half-read pipeline would hand us somebody else's reply.
    ec.fail(errc::protocol_error, opts_.describe() + ": command() called with " + std::to_string(pending_) +
                                      " pipelined replies unread");
    return nullptr;
  }
  connect(ec);
  if (ec) return nullptr;
  const std::string_view what = argv.empty() ? std::string_view("command") : argv.front();
  std::string cmd;
  if (!format_command(cmd, argv)) {
    fail_io(ec, what, "out of memory");
    return nullptr;
  }
  ++round_trips_;
  if (opts_.round_trips) opts_.round_trips->add();
  const auto deadline = Socket::Clock::now() + opts_.command_timeout;
  Error io;
  if (!sock_->write_all(cmd, deadline, io)) {
    fail_io(ec, what, io.detail());
    return nullptr;
  }
  Reply r(sock_->read_reply(*reader_, deadline, io).release());
  if (!r) {
    fail_io(ec, what, io.detail());
    return nullptr;
  }
  if (r->type == REDIS_REPLY_ERROR) fail_reply(r.get(), ec);
  return r;
}

void Connection::append(std::span<const std::string_view> argv) {
  if (!sock_ && pending_ == 0) {
    Error ec;
    connect(ec);
    pending_connect_failed_ = static_cast<bool>(ec);
    pending_ec_ = std::move(ec);
  }
  ++pending_;
  if (pending_connect_failed_ || !sock_) return;
  if (!format_command(obuf_, argv)) {
    // Only out of memory can fail here; report it at the read.
    pending_connect_failed_ = true;
    pending_ec_.fail(errc::backend_unavailable,
                     opts_.describe() + ": cannot buffer a command (out of memory)");
  }
}

// Sends the appended commands. False (the connection dropped, the replies of the
// batch lost) when the transport failed.
bool Connection::send_buffered(Error& ec) {
  if (obuf_.empty()) return true;
  ++round_trips_;  // the replies of this batch are read without another flush
  if (opts_.round_trips) opts_.round_trips->add();
  Error io;
  const bool sent = sock_->write_all(obuf_, Socket::Clock::now() + opts_.command_timeout, io);
  obuf_.clear();
  if (sent) return true;
  const std::size_t lost = pending_;
  fail_io(ec, "sending a pipeline", io.detail());
  pending_ = lost;
  pending_connect_failed_ = pending_ != 0;
  pending_ec_ = ec;
  return false;
}

// The error of a reply lost before it was read: what lost it, else backend_unavailable.
static Error lost_reply_error(const Error& pending_ec, const ConnectionOptions& opts) {
  if (pending_ec) return pending_ec;
  return {make_error_code(errc::backend_unavailable), opts.describe() + ": not connected"};
}

void Connection::flush(Error& ec) {
  ec.clear();
  if (pending_connect_failed_ || !sock_) {
    if (pending_ != 0) ec = lost_reply_error(pending_ec_, opts_);
    return;
  }
  send_buffered(ec);
}

Reply Connection::read_reply(Error& ec) {
  ec.clear();
  if (pending_ == 0) {
    ec.fail(errc::protocol_error, opts_.describe() + ": read_reply() without an appended command");
    return nullptr;
  }
  if (pending_connect_failed_ || !sock_) {
    ec = lost_reply_error(pending_ec_, opts_);
    if (--pending_ == 0) pending_connect_failed_ = false;
    return nullptr;
  }
  if (!send_buffered(ec)) {
    if (--pending_ == 0) pending_connect_failed_ = false;
    return nullptr;
  }
  Error io;
  Reply r(sock_->read_reply(*reader_, Socket::Clock::now() + opts_.command_timeout, io).release());
  if (!r) {
    const std::size_t lost = pending_;
    fail_io(ec, "reading a pipelined reply", io.detail());
    // Callers still count the lost replies down.
    pending_ = lost - 1;
    pending_connect_failed_ = pending_ != 0;
    pending_ec_ = ec;
    return nullptr;
  }
  --pending_;
  return r;
}

std::vector<Reply> Connection::read_replies(std::size_t n, Error& ec) {
  ec.clear();
  std::vector<Reply> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    Error one;
    out.push_back(read_reply(one));
    if (one && !ec) ec = one;
  }
  return out;
}

std::vector<Reply> Connection::exchange(std::span<const Argv> batch, Error& ec) {
  for (const Argv& argv : batch) append(argv);
  return read_replies(batch.size(), ec);
}

bool Connection::looks_broken() const noexcept {
  return !sock_ || sock_->idle_but_readable();
}

// ---- pool ------------------------------------------------------------------------

PooledConnection::PooledConnection(PooledConnection&& o) noexcept
    : pool_(o.pool_), conn_(std::move(o.conn_)) {
  o.pool_ = nullptr;
}

PooledConnection& PooledConnection::operator=(PooledConnection&& o) noexcept {
  if (this != &o) {
    if (pool_ && conn_) pool_->give_back(std::move(conn_));
    pool_ = o.pool_;
    conn_ = std::move(o.conn_);
    o.pool_ = nullptr;
  }
  return *this;
}

PooledConnection::~PooledConnection() {
  if (pool_ && conn_) pool_->give_back(std::move(conn_));
}

ConnectionPool::ConnectionPool(ConnectionOptions opts, std::size_t max_idle)
    : opts_(std::move(opts)), max_idle_(max_idle) {}

ConnectionPool::~ConnectionPool() = default;

PooledConnection ConnectionPool::checkout(Error& ec) {
  ec.clear();
  for (;;) {
    std::unique_ptr<Connection> conn;
    {
      LockGuard lk(mu_);
      if (idle_.empty()) break;
      conn = std::move(idle_.back());
      idle_.pop_back();
    }
    if (!conn->looks_broken()) return PooledConnection(this, std::move(conn));
    // The server closed it (restart, timeout, CLIENT KILL): drop it and try the next.
  }
  auto conn = std::make_unique<Connection>(opts_);
  conn->connect(ec);
  if (ec) return {};
  return PooledConnection(this, std::move(conn));
}

std::size_t ConnectionPool::idle() const {
  LockGuard lk(mu_);
  return idle_.size();
}

void ConnectionPool::give_back(std::unique_ptr<Connection> conn) noexcept {
  if (!conn->connected() || conn->pending() != 0) return;  // broken or mid-pipeline: discard
  LockGuard lk(mu_);
  if (idle_.size() < max_idle_) {
    try {
      idle_.push_back(std::move(conn));
    } catch (...) {  // out of memory: just close it
    }
  }
}

// ---- Script ------------------------------------------------------------------------

Script::Script(std::string source) : source_(std::move(source)) {}

std::string Script::sha() const {
  LockGuard lk(mu_);
  return sha_;
}

void Script::load(Link& conn, Error& ec) const {
  Reply r = conn.command({"SCRIPT", "LOAD", source_}, ec);
  if (ec) return;
  if (r->type != REDIS_REPLY_STRING || r->len != 40) {
    ec.fail(errc::protocol_error, "SCRIPT LOAD answered something other than a SHA1");
    return;
  }
  LockGuard lk(mu_);
  sha_.assign(r->str, r->len);
}

std::string Script::ensure_sha(Link& conn, Error& ec) const {
  ec.clear();
  std::string s = sha();
  if (!s.empty()) return s;
  load(conn, ec);
  return ec ? std::string() : sha();
}

bool Script::copy_sha(Sha& out) const {
  LockGuard lk(mu_);
  if (sha_.size() != out.size()) return false;
  std::memcpy(out.data(), sha_.data(), out.size());
  return true;
}

Argv Script::evalsha_argv(const std::string& sha, std::span<const std::string_view> keys,
                          std::span<const std::string_view> args, std::string& numkeys) const {
  numkeys = std::to_string(keys.size());
  Argv argv;
  argv.reserve(3 + keys.size() + args.size());
  argv.push_back("EVALSHA");
  argv.push_back(sha);
  argv.push_back(numkeys);
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The call's arguments in an array on the stack when they fit (every lock call), so a
// call allocates nothing here; the SHA1 is copied into a fixed buffer, not a string.
Reply Script::run(Link& conn, std::span<const std::string_view> keys, std::span<const std::string_view> args,
                  Error& ec) const {
  ec.clear();
  Sha sha;
  if (!copy_sha(sha)) {
    load(conn, ec);
    if (ec) return nullptr;
    if (!copy_sha(sha)) {
      ec.fail(errc::protocol_error, "SCRIPT LOAD answered something other than a SHA1");
      return nullptr;
    }
  }
  char numkeys[24];
  const std::string_view n(
      numkeys,
      static_cast<std::size_t>(std::to_chars(numkeys, numkeys + sizeof numkeys, keys.size()).ptr - numkeys));
  constexpr std::size_t kOnStack = 24;
  std::array<std::string_view, kOnStack> small;
  Argv large;
  const std::size_t argc = 3 + keys.size() + args.size();
  std::span<std::string_view> argv;
  if (argc <= kOnStack) {
    argv = std::span(small.data(), argc);
  } else {
    large.resize(argc);
    argv = std::span(large);
  }
  argv[0] = "EVALSHA";
  argv[1] = std::string_view(sha.data(), sha.size());
  argv[2] = n;
  std::copy(keys.begin(), keys.end(), argv.begin() + 3);
  std::copy(args.begin(), args.end(), argv.begin() + 3 + static_cast<std::ptrdiff_t>(keys.size()));
  Reply r = conn.command(argv, ec);
  if (!is_error(r.get(), "NOSCRIPT")) return r;
  // The server lost its script cache (restart, SCRIPT FLUSH): load and retry once.
  load(conn, ec);
  if (ec) return nullptr;
  if (!copy_sha(sha)) {
    ec.fail(errc::protocol_error, "SCRIPT LOAD answered something other than a SHA1");
    return nullptr;
  }
  return conn.command(argv, ec);
}

std::vector<Reply> Script::run_pipelined(Link& conn, std::span<const Call> calls, Error& ec) const {
  std::vector<Reply> out;
  std::string sha = ensure_sha(conn, ec);
  if (ec) return out;
  std::vector<Argv> argvs;
  argvs.reserve(calls.size());
  std::vector<std::string> numkeys_texts(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    argvs.push_back(evalsha_argv(sha, calls[i].keys, calls[i].args, numkeys_texts[i]));
  }
  out = conn.exchange(argvs, ec);
  if (ec) return out;
  std::vector<std::size_t> again;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (is_error(out[i].get(), "NOSCRIPT")) again.push_back(i);
  }
  if (again.empty()) return out;
  load(conn, ec);
  if (ec) return out;
  sha = this->sha();
  std::vector<Argv> retry;
  for (std::size_t i : again) {
    argvs[i][1] = sha;
    retry.push_back(argvs[i]);
  }
  std::vector<Reply> retried = conn.exchange(retry, ec);
  for (std::size_t j = 0; j < again.size(); ++j) out[again[j]] = std::move(retried[j]);
  return out;
}

}  // namespace distlock::detail::redis
