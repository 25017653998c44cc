// Engine: revoke (Client::revoke, Client::last_revoke) and the holder's side of it: a
// refused renewal whose lock carries a revoke note of its token is a revoke.
//
// The note a backend keeps beside the lock (Backend::revoke) is
//   "<token>\n<holder owner>\n<unix ms>\n<revoker owner>\n<reason>"
// where the backend writes the first two lines (read atomically with the revoke) and
// the engine the rest. The reason comes last: it may hold newlines.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>

#include "engine/engine.hpp"

namespace distlock::detail {

namespace {

constexpr std::size_t kMaxReason = 1024;
// Revoke notes read for one renewal batch's refused leases: each is a round trip on the
// renewer thread before the losses are declared. A batch with more refusals (a failover,
// a flushed server) declares the rest renewal_refused at once.
constexpr std::size_t kMaxNoteReads = 8;

struct Note {
  std::uint64_t token = 0;
  std::string holder;
  std::int64_t at_ms = 0;
  std::string by;
  std::string reason;
};

// Splits off the text up to the next '\n'; false when there is none.
bool take_line(std::string_view& rest, std::string_view& line) {
  const std::size_t nl = rest.find('\n');
  if (nl == std::string_view::npos) return false;
  line = rest.substr(0, nl);
  rest.remove_prefix(nl + 1);
  return true;
}

template <class Int>
bool parse_int(std::string_view s, Int& out) {
  if (s.empty()) return false;
  const auto [p, err] = std::from_chars(s.data(), s.data() + s.size(), out);
  return err == std::errc() && p == s.data() + s.size();
}

std::optional<Note> parse_note(std::string_view text) {
  Note n;
  std::string_view token, holder, at, by;
  if (!take_line(text, token) || !take_line(text, holder) || !take_line(text, at) || !take_line(text, by)) {
    return std::nullopt;
  }
  if (!token.empty() && !parse_int(token, n.token)) return std::nullopt;
  if (!parse_int(at, n.at_ms)) return std::nullopt;
  n.holder = holder;
  n.by = by;
  n.reason = text;
  return n;
}

// "<id> (<info>)" or "<id>" for an owner "<id>|<info>".
std::string shown_owner(std::string_view owner) {
  auto [id, desc] = split_owner(owner);
  std::string out(id);
  if (desc) out += " (" + std::string(*desc) + ")";
  return out;
}

}  // namespace

RevokeResult Engine::revoke(std::string_view name, std::string_view reason, Error& ec) {
  ec.clear();
  if (forked()) {
    ec = make_error_code(errc::forked);
    return {};
  }
  if ((ec = check_name(name))) return {};
  // Printed raw in logs and in `distlock status`: no control character (a newline could
  // forge an audit line, an escape drive the reader's terminal). UTF-8 text passes.
  const auto control = std::find_if(reason.begin(), reason.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b < 0x20 || b == 0x7f;
  });
  if (reason.empty() || reason.size() > kMaxReason || control != reason.end()) {
    char hex[8] = "";
    if (control != reason.end())
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned>(static_cast<unsigned char>(*control)));
    ec.fail(errc::invalid_argument, control != reason.end()
                                        ? "the revoke reason must be text without control characters: byte " +
                                              std::to_string(control - reason.begin()) + " is " + hex
                                        : "the revoke reason must be 1 to 1024 bytes (it is " +
                                              std::to_string(reason.size()) + " bytes)");
    return {};
  }
  std::string by = client_id_;
  if (!opts_.lock_defaults.holder_info.empty()) by += "|" + opts_.lock_defaults.holder_info;
  const auto at = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const std::string note = std::to_string(at) + "\n" + by + "\n" + std::string(reason);
  const auto life = std::chrono::duration_cast<Millis>(RevokeRecord::kept);
  Backend::Revoked r;
  try {
    r = backend_->revoke(name, note, life, ec);
  } catch (const std::system_error& e) {
    ec = e.code();
  }
  MetricsSeries* series = metrics_ ? metrics_->series_for(name) : nullptr;
  if (ec) {
    if (series) metrics_->revoke(series, RevokeOutcome::error);
    if (ec == errc::not_supported && ec.detail().empty()) {
      ec.set_detail("backend " + backend_->url() +
                    " cannot end another process's hold (docs/design.md \"Revoke\")");
    }
    return {};
  }
  if (series) metrics_->revoke(series, r.revoked ? RevokeOutcome::revoked : RevokeOutcome::nothing_held);
  RevokeResult out;
  out.revoked = r.revoked;
  if (!r.revoked) {
    log_.log(LogLevel::info, "revoke of lock \"{}\": nothing held (reason given: {})", name, reason);
    return out;
  }
  if (caps_.fencing) out.token = r.token;
  // An empty holder: the backend ended a lease but cannot tell whose (redlock:// with masters
  // silent, two owners each possible): RevokeResult::holder stays empty.
  if (!r.holder.empty()) {
    auto [id, desc] = split_owner(r.holder);
    out.holder = std::string(id);
    if (desc) out.holder_info = std::string(*desc);
  }
  log_.log(LogLevel::warning, "lock \"{}\" revoked: token {}, holder {}, by {}: {}", name,
           caps_.fencing ? std::to_string(r.token) : std::string("none"),
           r.holder.empty() ? std::string("unknown") : shown_owner(r.holder), shown_owner(by), reason);
  return out;
}

std::optional<RevokeRecord> Engine::last_revoke(std::string_view name, Error& ec) {
  ec.clear();
  if (forked()) {
    ec = make_error_code(errc::forked);
    return std::nullopt;
  }
  if ((ec = check_name(name))) return std::nullopt;
  std::optional<std::string> text = backend_->revoke_note(name, ec);
  if (ec) {
    if (ec == errc::not_supported && ec.detail().empty()) {
      ec.set_detail("backend " + backend_->url() + " keeps no revoke notes (docs/design.md \"Revoke\")");
    }
    return std::nullopt;
  }
  if (!text) return std::nullopt;
  std::optional<Note> n = parse_note(*text);
  if (!n) {
    ec.fail(errc::protocol_error,
            "the revoke note of lock \"" + std::string(name) + "\" is not one distlock wrote");
    return std::nullopt;
  }
  RevokeRecord rec;
  rec.at = std::chrono::system_clock::time_point(std::chrono::milliseconds(n->at_ms));
  auto [by, by_info] = split_owner(n->by);
  rec.by = std::string(by);
  if (by_info) rec.by_info = std::string(*by_info);
  rec.reason = std::move(n->reason);
  if (caps_.fencing) rec.token = n->token;
  auto [holder, holder_info] = split_owner(n->holder);
  rec.holder = std::string(holder);
  if (holder_info) rec.holder_info = std::string(*holder_info);
  return rec;
}

void Engine::declare_refused(const std::vector<std::shared_ptr<HeldLock>>& refused) noexcept {
  std::size_t reads = 0;
  for (const auto& h : refused) {
    // Read before the note's round trip: a refusal while the lease was still ours by our
    // own deadline is a brain split, unless it was a revoke.
    const bool before_deadline = clock_->now() < h->deadline();
    std::optional<Note> note;
    if (reads < kMaxNoteReads) {
      ++reads;
      try {
        Error ec;
        std::optional<std::string> text = backend_->revoke_note(h->name, ec);
        if (!ec && text) note = parse_note(*text);
      } catch (...) {  // no memory, or the backend's exception: an ordinary refusal
      }
    }
    const bool revoked = note && note->holder == h->owner && (!h->has_token || note->token == h->token);
    if (!revoked) {
      if (before_deadline) n_brain_splits_.fetch_add(1, std::memory_order_relaxed);
      declare_lost(h, LossReason::renewal_refused, "the server says another owner (or nobody) holds it");
      continue;
    }
    std::string why;
    try {
      why = "revoked by " + shown_owner(note->by) + ": " + note->reason;
    } catch (...) {
    }
    declare_lost(h, LossReason::revoked, why.empty() ? "revoked" : why.c_str(), &note->reason);
  }
}

}  // namespace distlock::detail
