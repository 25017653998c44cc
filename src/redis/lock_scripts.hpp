// redis/lock_scripts.hpp — the Lua scripts of the redis:// lock, with its FIFO
// wait queue and direct hand-off (docs/redis.md, model/redis_handoff.pml).
//
// Keys of one name, all under the hash tag {<name>} so they share a slot:
//   <p>:{<name>}          hash {<owner>: <entry>, "@token": <token>}, PEXPIRE ttl
//   <p>:{<name>}:q        list of waiting entries "<entry> <owner>", oldest first (the
//                         entry is digits; an owner id may hold spaces: its holder info)
//   <p>:{<name>}:qx       hash "<entry> <owner>" -> "<expiry ms>:<ttl ms>" (server time)
//   <p>:{<name>}:delay    lock-delay marker: value D ms, PX lease end + D (server time);
//                         set only by a holder with lock_delay, deleted by its release
//   <p>:{<tag>}:fence     the fence counter of the name's hash slot, shared by every
//                         name in that slot (never expires; redis/key_layout.hpp)
// and two channels: <p>:{<name>}:released (published only when a release leaves
// the lock free) and <p>:grant:<client> (a grant to one of that client's entries:
// "<entry> <token> <length of the lock key> <lock key><owner>"). An entry id is unique per enqueue within a
// client ("0" marks an acquisition that never queued), so a late grant of an entry that is gone can never be
// taken for a grant of a newer wait.
//
// The server keeps owner, entry and token only: holding twice is the engine's
// business (it never asks twice for a name it holds), so there is no hold count.
//
// Thread-safety: the Script objects are shared and safe to use from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "engine/backend.hpp"
#include "redis/connection.hpp"

namespace distlock::detail::redis {

/// A queued entry expires this long after its last refresh (its ttl if shorter):
/// the place of a waiter that died or stopped lapses within it, whatever its ttl.
/// Clients refresh their entries four times per entry life (wait_queue.cpp).
inline constexpr std::chrono::milliseconds kEntryLife{2000};
/// A grant holds the lock this long (the ttl if shorter) until the grantee claims
/// it (its next acquire or refresh call restarts the lock's ttl). A grant to a
/// waiter that died since its last refresh lapses then, and the next waiter's
/// refresh (at most a refresh period later) takes the free lock over: a dead
/// waiter delays the next live one by at most kClaimWindow + kEntryLife / 4 after
/// a release (docs/design.md "A dead waiter").
inline constexpr std::chrono::milliseconds kClaimWindow{1000};

/// KEYS lock, queue, expiries, fence; ARGV owner, ttl ms, entry, mode, grant prefix,
/// lock-delay ms (optional, "0" off: the marker <lock>:delay lives ttl + delay, see
/// lock_scripts.cpp; while a marker lives the lock is busy with its PTTL).
/// mode "0": one attempt that never queues (and never jumps a live queue);
/// "1": enqueue `entry` (or refresh it) and take the lock if it is free and the
/// entry is first; "2": a re-check of an entry queued before: it is refreshed, or
/// the answer is "gone" when it is no longer queued (it expired, or it was granted
/// and lost) — a gone entry is never queued again under the same id.
/// Returns {1, token} acquired (also when the lock was granted to `entry` meanwhile:
/// the claim, its TTL restarts now); {0, pttl} busy (pttl of the holder, -1/-2 when unknown);
/// {2} gone.
const Script& queue_acquire_script();

/// The reply of queue_acquire_script() or cluster_queue_acquire_script(), read by
/// read_acquire_reply().
struct AcquireReply {
  enum class Kind {
    acquired,  ///< {1, token}: the lock is this call's (taken now, or a grant claimed)
    busy,      ///< {0, pttl}: someone holds it (or a lock-delay holds it back)
    gone,      ///< {2}: the re-checked entry is no longer queued
  };
  Kind kind = Kind::busy;
  std::uint64_t token = 0;                  ///< acquired: the lease's fencing token
  std::chrono::milliseconds holder_ttl{0};  ///< busy: the holder's remaining time, 0 when unknown
};

/// Reads the acquire script's reply, {1, token} | {0, pttl} | {2}, for every backend that
/// runs it (redis://, redis+sentinel://, redis+cluster://). A pttl of -1 or -2 (the lock has
/// no expiry, or has just gone) and 0 are "unknown": holder_ttl 0. An error reply sets `ec`
/// to error_code_of()'s code with the server's text as its detail; any other shape (not an
/// array, a flag other than 0, 1 or 2, the wrong number of elements for its flag, a token
/// that is not a non-negative integer, a pttl that is not an integer of at least -2) sets
/// errc::protocol_error with a detail naming what was wrong. On an error the returned value
/// is {busy, 0, 0} and must not be used.
AcquireReply read_acquire_reply(const redisReply* r, Error& ec);

/// What one call of a queue's acquire script tells the backend that made it (redis:// and
/// redis+cluster://): the engine's result, and whether a re-checked entry was gone.
struct QueueAnswer {
  AcquireResult result;
  bool gone = false;  ///< the re-checked entry is no longer queued
};

/// The answer `reply` gives a request of `ttl`: acquired (its token, validity `ttl` counted
/// from the send), busy (the holder's remaining time when known) or gone.
QueueAnswer answer_of(const AcquireReply& reply, std::chrono::milliseconds ttl);

/// KEYS lock, queue, expiries, fence; ARGV owner, released channel, grant prefix.
/// A normal release: deletes the holder's lock-delay marker. -1 when `owner` holds
/// nothing (nothing touched); 0 released: the lock goes to the first live waiter
/// (published on its client's grant channel; it must claim the grant within
/// kClaimWindow), or, with nobody waiting, is deleted and the release is published
/// on the released channel.
const Script& queue_release_script();

/// KEYS lock, queue, expiries, fence; ARGV owner, entry, released channel, grant
/// prefix. Gives up a wait: 1 when the lock had been granted to `entry` (it is
/// handed on as by a release), else 0 (the entry is removed if it is still queued).
const Script& queue_cancel_script();

/// KEYS lock, queue, expiries, fence; ARGV owner, token, released channel, grant
/// prefix. A lease the engine declared lost (Backend::forget): removes every queue
/// entry of `owner`, then, if the lock is still held by `owner` under `token`,
/// releases it onward as the release script does. 1 released, 0 nothing held.
const Script& queue_forget_script();

/// KEYS lock, revoke note; ARGV note, note life ms[, "<prefix>:" (redis:// and
/// redis+sentinel://: a "revoked" message on the events channel while a watch is
/// registered), the slot's sharded events channel (redis+cluster://: always SPUBLISHed)];
/// both sent by publish_change (change_event_lua). Backend::revoke of redis://,
/// redis+sentinel:// and redis+cluster://: whoever holds the lock loses it; the note
/// "<token>\n<owner>\n<note>" is stored (PX note life) and the holder's field leaves the
/// lock hash, which keeps its expiry (no owner: nobody renews it, nobody is granted it
/// until it expires; then the queue's refresh hands it on as after an expired holder).
/// {1, token, owner} revoked; {0} nobody held it (nothing written).
const Script& revoke_script();

/// The Lua functions that publish a lock's change for Client::watch, shared by every lock
/// script of redis://, redis+sentinel:// and redis+cluster://:
/// `publish_change(base, shard, kind, token, owner, lock)` sends
/// "<kind> <token> <owner length> <owner><lock key>" by SPUBLISH on `shard` when it is a
/// non-empty string (while the node counts a subscriber of it: PUBSUB SHARDNUMSUB), else by
/// PUBLISH on "<base>events" while the watcher-presence
/// key "<base>watching" exists (nothing when `base` is empty too). lock_scripts.cpp says why.
std::string_view change_event_lua();

/// KEYS 4 per entry: lock, queue, expiries, fence; ARGV grant prefix, then 3 per
/// entry: owner, entry, ttl ms. One status per entry: 0 refreshed (still queued,
/// expiry = now + min(ttl, kEntryLife)), the token (a string) when the lock was
/// granted to it (not a claim: the grant keeps min(ttl, kClaimWindow) from now, a
/// claimed lease is not shortened; the waiter claims it with its acquire call), 2 gone. A queued entry
/// finding its lock free grants it to the queue's first live entry (itself, or another waiter, told on its
/// grant channel).
const Script& queue_refresh_script();

/// The same five scripts for redis+cluster:// (docs/redis-cluster.md "How waiting works"),
/// with five keys per name, all in the name's slot: lock, queue, expiries, fence, lock-delay
/// marker (the release may leave the marker out for a lease acquired without lock_delay: a
/// lock held by such a lease has no marker). In place of the grant prefix they take the
/// slot's sharded events channel (Client::watch). A grant is SPUBLISHed on the name's
/// release channel (a channel of the lock's slot, derived from the lock key as
/// rediscluster::keys_of() does) as "<entry> <token> <length of the lock key> <lock
/// key><owner>": every waiting client of the name receives it, and only the client of
/// `owner` wakes its waiter. A release that leaves the lock free SPUBLISHes "released"
/// on the same channel. Arguments and answers otherwise as above.
const Script& cluster_queue_acquire_script();
const Script& cluster_queue_release_script();
const Script& cluster_queue_cancel_script();
const Script& cluster_queue_forget_script();
const Script& cluster_queue_refresh_script();

/// KEYS lock, expiries → {HGETALL lock (empty for a key of another type: not a lock),
/// PTTL lock, live waiters}.
const Script& queue_status_script();

}  // namespace distlock::detail::redis
