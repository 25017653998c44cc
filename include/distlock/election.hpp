// distlock/election.hpp — leader election (etcd's Election API) on every backend.
//
// An election is one ordinary lock with a derived name, `<name>\x1felect`: the
// leader is its holder, and the leader's TERM is that lock's fencing token, so terms
// strictly increase from one leader to the next, across clients and restarts. The
// value a leader proclaims is kept in the record `<name>\x1felect` as
// "<term>\n<value>", written right after winning and by every proclaim(). Because the
// record names its term, a reader never attributes a value to the wrong leader: a
// value is reported only when the record's term equals the current holder's token.
// Every write of the record is fenced on the server: it lands only when the record's
// term is not newer than the writer's (one atomic step, or a compare-and-set loop), so
// the record's value is written only by a client whose term is the newest the record
// has seen — a deposed leader's late campaign or proclaim write is refused, never
// hides the newer leader's value. This assumes terms are the lock's fencing tokens
// (strictly increasing per name) and that nothing but the election writes the record.
//
// Campaigning is acquiring: campaign() waits like Client::acquire (by change
// notification, up to LockOptions::wait, forever if unset) and returns the lease;
// leadership lasts while the lease does (renewed in the background, lost at the
// conservative local deadline, stop token fired on loss). Pass lease.token() (the
// term) to whatever the leader writes, so a deposed leader's late writes can be fenced.
//
// Observing: observe(after_term, wait) returns the first leader it reads whose term is
// greater than `after_term`. Calling it again with the term it returned gives each
// observer a sequence of leaders that
//   - is in strictly increasing term order, and never repeats a leader;
//   - never contains a leader whose lease the server had already ended when it was
//     read (the server said held, with time left, on that read);
//   - carries, for each leader, the value that leader proclaimed for its term
//     (`value_known`); see Leader::value_known for the one exception.
// What an observer can MISS: a leader that wins and loses (or resigns) between two of
// the observer's reads is never reported — observers see the leaders that hold when
// they look, not every term (a term gap in the sequence shows where). Two observers
// see the same sequence when every leader stays until each observer has read it.
// Observers wait by notification: a release of the election lock wakes them, and a
// new leader "rings" a bell lock (`<name>\x1felect\x1fbell`: acquired and released at
// once, after the value is written), whose release notification wakes observers that
// found the election vacant. A missed notification (a lease that expires without one,
// on Redis) costs at most a re-check capped by the holder's remaining TTL (5 s at most).
//
// Backends without fencing tokens (redlock://): campaign(), resign() and leader() work
// and give the same mutual exclusion as the lock, but there are no terms:
// Lease::token() throws errc::not_supported, Leader::term is 0, leader() reports the
// holder with `value_known == false` and an empty value (a record cannot be matched to
// a holder without a term), proclaim() still writes the record, and observe() throws
// errc::not_supported (without terms there is no order to promise).
//
// Thread-safety: an Election is a cheap value (client handle + name + options); its
// members may be called from any thread. A leadership Lease is an ordinary Lease.
//
// Example:
//   auto client = distlock::connect("etcd://127.0.0.1:2379");
//   distlock::Election e = client.election("scheduler");
//   distlock::Lease lead = e.campaign("host-a:8080");         // blocks until leader
//   std::uint64_t term = lead.token();                          // fence writes with it
//   while (!lead.stop_token().stop_requested()) schedule(term);
//   e.resign(lead);
//
//   // elsewhere: follow the leader
//   std::optional<std::uint64_t> seen;
//   while (auto l = e.observe(seen, std::chrono::seconds(30))) {
//     std::cout << l->term << " " << l->value << "\n";
//     seen = l->term;
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "distlock/client.hpp"
#include "distlock/export.hpp"
#include "distlock/options.hpp"

namespace distlock {

/// Who leads an election, as read from the server.
struct DISTLOCK_EXPORT Leader {
  /// The value the leader proclaimed for `term` (empty when !value_known).
  std::string value;
  /// The leader's term: its lease's fencing token. 0 on backends without tokens.
  std::uint64_t term = 0;
  /// The owner id of the leader's lease (what `distlock status` shows as holder).
  std::string holder;
  /// False when the value cannot be attributed to this leader: it has won but not yet
  /// written its value (a moment after winning), or the backend has no terms. (A
  /// deposed leader's delayed write cannot overwrite it: writes are fenced by term.) leader()
  /// reports such a leader as is; observe() waits for the value (by notification) up
  /// to twice the client's command timeout, then reports it with value_known false.
  bool value_known = false;
  /// The server's time to expiry of the leader's lease, if the backend tells it.
  std::optional<Millis> ttl_remaining;
};

class DISTLOCK_EXPORT Election {
 public:
  /// Normally made by Client::election(name[, opts]). `opts` are the leadership
  /// lease's options (ttl, wait for campaign(), ...). Throws errc::invalid_argument
  /// for an empty name or one with a NUL byte.
  Election(Client client, std::string name, LockOptions opts);

  /// Blocks until this caller leads (waiting opts.wait, forever if unset), writes
  /// `value` for its term and returns the leadership lease (lease.token() == term).
  /// Throws like Client::acquire (errc::timeout, errc::busy for a wait of 0, ...);
  /// errc::invalid_argument for a value over 64 KiB - 32 bytes. If the value cannot
  /// be written, the lease is released and that error is thrown (errc::not_supported
  /// on a backend that keeps no records); errc::lost, the lease released, when the
  /// record already holds a newer term (this lease was lost to a newer leader before
  /// its value landed).
  Lease campaign(std::string_view value);
  Lease campaign(std::string_view value, std::error_code& ec) noexcept;

  /// Replaces the leader's value. Throws errc::not_owner, and writes nothing, when
  /// `leadership` is not this election's lease or is no longer held (lost, released,
  /// past its local deadline), and also when the server finds a newer term in the
  /// record at the write (the lease was lost after the local check: a newer leader
  /// has written); that error names the newer term. The lease itself is left as it is
  /// (it is lost, or about to be).
  void proclaim(const Lease& leadership, std::string_view value);

  /// Gives up leadership: releases the lease (Lease::release: errc::lost if it had
  /// been lost). errc::invalid_argument if `leadership` is not this election's.
  void resign(Lease& leadership);

  /// Who leads now (nullopt: nobody). One status read and one record read.
  std::optional<Leader> leader();

  /// Blocks until it reads a leader whose term is greater than `after_term` (any
  /// leader when nullopt) and returns it; nullopt when `wait` passes first (nullopt
  /// wait: no limit). See the header comment for what observers see and can miss.
  /// errc::not_supported on backends without fencing tokens.
  std::optional<Leader> observe(std::optional<std::uint64_t> after_term, std::optional<Millis> wait);

  /// The election's name, and the derived lock / bell names it uses.
  const std::string& name() const noexcept { return name_; }
  const std::string& lock_name() const noexcept { return lock_name_; }
  const std::string& bell_name() const noexcept { return bell_name_; }

  /// The record text for a term and value: "<term>\n<value>".
  static std::string encode_record(std::uint64_t term, std::string_view value);
  /// Splits a record into term and value; nullopt when malformed.
  static std::optional<std::pair<std::uint64_t, std::string>> decode_record(std::string_view record);

 private:
  DISTLOCK_NO_EXPORT std::optional<Leader> read(detail::Error& ec);
  /// Writes "<term>\n<value>" unless the record holds a newer term (a fenced put);
  /// refused: `refused` with a detail naming the newer term.
  DISTLOCK_NO_EXPORT void write_value(std::uint64_t term, std::string_view value, errc refused,
                                      detail::Error& ec);
  void ring() noexcept;
  Client client_;
  std::string name_, lock_name_, bell_name_;
  LockOptions opts_;
};

}  // namespace distlock
