/* Redis direct hand-off ("fair lock") protocol: a bounded model.
 *
 * Server state (one lock name): owner (client, wait epoch), token, lock expiry,
 * and a FIFO queue of waiters (client, epoch, entry expiry). Time is a global
 * counter advanced by its own process, so any step can be delayed arbitrarily
 * (a paused holder or waiter, a slow network); a client may also die at any step.
 * A request is sent at one moment, executed atomically by the server later and
 * answered later still; the grant notification can be lost or arrive late.
 *
 * Found while writing it, and now part of the protocol: a grant notification
 * must name the queue entry (unique per enqueue, not per wait), or a late
 * notification of an entry that expired is taken for a grant of the next one;
 * and a re-check must never put back an entry that is gone (granted and lost,
 * or expired), or a waiter that walks away is granted afterwards.
 *
 * A grant holds the lock for CLAIM ticks only, until the grantee claims it from the
 * server (its acquire call restarts the TTL; a refresh that finds the grant only
 * restarts the claim window, never shortening the lock); a queue entry lives
 * QLIFE ticks after its last refresh; a refresh that finds the lock free grants it to
 * the head. So a waiter that died holds nobody up for its TTL (issue 27, item 2).
 *
 * Checked: (1) whenever a client believes it holds the lock (held and now <
 * its local deadline), the server's owner is that client's wait and the server's
 * expiry is not earlier than the local deadline: so two clients never both
 * believe; (2) a waiter that gave up is never left as the owner; (3) tokens
 * strictly increase with each grant; (4) a grant its owner has not claimed with an
 * acquire call never outlives CLAIM ticks from now (so a waiter that dies after
 * being granted, even after a refresh that found the grant, holds the lock at most
 * that long; before, the refresh claimed it for the TTL).
 */
#ifndef N
#define N 2          /* clients: 2 or 3 */
#endif
#define TTL 3        /* lease lifetime, in ticks */
#define QLIFE 2      /* a queue entry's lifetime after its last refresh (< TTL: kEntryLife) */
#define CLAIM 1      /* a grant's lifetime until the grantee claims it (kClaimWindow) */
#ifndef TMAX
#define TMAX 3       /* time bound */
#endif
#define EPOCHS 2     /* queue entries per client */
#define QMAX N

byte now = 0;
hidden byte i, j, k;   /* scratch, used only inside atomic steps: not part of the state */

/* server */
byte owner = 0;      /* client id 1..N, 0 = none */
byte owner_ep = 0;
byte lock_exp = 0;   /* the lock exists while now < lock_exp */
byte token = 0;
bool claimed = false; /* the owner's own acquire call claimed the lock (not a grant) */
byte q_c[QMAX];      /* queue: client, epoch, expiry */
byte q_ep[QMAX];
byte q_exp[QMAX];
byte qlen = 0;
chan note[N + 1] = [1] of { byte };  /* grant notifications (epoch), lossy */

/* clients' beliefs, for the invariant */
bool held[N + 1];
byte deadline[N + 1];
byte cur_ep[N + 1];
byte last_token = 0;

inline q_remove(i) {
  j = i;
  do
  :: j + 1 < qlen -> q_c[j] = q_c[j + 1]; q_ep[j] = q_ep[j + 1]; q_exp[j] = q_exp[j + 1]; j++
  :: else -> break
  od;
  qlen--;
  q_c[qlen] = 0; q_ep[qlen] = 0; q_exp[qlen] = 0;
  j = 0
}

/* Drops queue entries that expired (dead or paused waiters). */
inline q_prune() {
  i = 0;
  do
  :: i < qlen && q_exp[i] <= now -> q_remove(i)
  :: i < qlen && q_exp[i] > now -> i++
  :: else -> break
  od;
  i = 0
}

inline q_find(c, ep) {
  k = 0;
  do
  :: k < qlen && !(q_c[k] == c && q_ep[k] == ep) -> k++
  :: else -> break
  od
}

/* Grants the free lock to the queue's head, if any live entry is left. */
inline grant_head() {
  q_prune();
  if
  :: qlen > 0 ->
     owner = q_c[0]; owner_ep = q_ep[0]; token++; lock_exp = now + CLAIM; claimed = false;
     assert(token > last_token); last_token = token;
     if
     :: nfull(note[owner]) -> note[owner] ! owner_ep
     :: true -> skip      /* notification lost */
     fi;
     q_remove(0)
  :: else -> owner = 0; owner_ep = 0
  fi
}

inline lock_free() { (owner == 0 || lock_exp <= now) }

proctype Client(byte c) {
  byte ep = 0, s, r, e;
  bool queued;

next_wait:
  /* ep names one queue entry: a new one for each wait and for each re-queue, so a
     grant notification for an entry that is gone can never be taken for a grant of
     the current one */
  do
  :: ep < EPOCHS -> ep++; break
  :: else -> goto done
  od;
  cur_ep[c] = ep;
  queued = false;

acquire:
  /* The first call of an entry queues it; a re-check (queued) only refreshes it:
     an entry that is gone is never put back under the same name. */
  s = now;
  atomic {
    q_prune();
    q_find(c, ep);
    if
    :: owner == c && owner_ep == ep && lock_exp > now ->
       lock_exp = now + TTL; claimed = true; r = 1  /* granted meanwhile: we claim it */
    :: !(owner == c && owner_ep == ep && lock_exp > now) && queued && k == qlen ->
       r = 2                                  /* our entry expired or was granted and lost */
    :: !(owner == c && owner_ep == ep && lock_exp > now) && !(queued && k == qlen) ->
       if
       :: k < qlen -> q_exp[k] = now + QLIFE
       :: else -> assert(qlen < QMAX); q_c[qlen] = c; q_ep[qlen] = ep; q_exp[qlen] = now + QLIFE; qlen++
       fi;
       if
       :: (owner == 0 || lock_exp <= now) ->
          /* free: the head (maybe us) gets it; only the head's own call answers "granted" */
          if
          :: q_c[0] == c && q_ep[0] == ep ->
             owner = c; owner_ep = ep; token++; lock_exp = now + TTL; claimed = true;
             assert(token > last_token); last_token = token;
             q_remove(0); r = 1
          :: else -> grant_head(); r = 0
          fi
       :: else -> r = 0
       fi
    fi;
    k = 0
  }
  if
  :: r == 1 -> atomic { deadline[c] = s + TTL; held[c] = true; s = 0; r = 0 }; goto holding
  :: r == 2 -> r = 0; s = 0; goto next_wait
  :: r == 0 -> atomic { queued = true; s = 0 }
  fi;

waiting:
  do
  :: note[c] ? e ->
     /* a grant holds the lock only CLAIM ticks: it is claimed from the server (the
        acquire call restarts the lock's TTL; the local deadline counts from its send
        time); a stale message, from an earlier entry, finds nothing to claim */
     e = 0; goto acquire
  :: /* queue refresh, in the renewer's batch; an entry that finds the lock free
        (a grant to a dead waiter lapsed, a holder expired) grants it to the head */
     s = now;
     atomic {
       q_prune();
       q_find(c, ep);
       if
       :: k < qlen ->
          q_exp[k] = now + QLIFE;
          if
          :: lock_free() -> grant_head()
          :: else -> skip
          fi;
          q_find(c, ep)
       :: else -> skip
       fi;
       if
       :: k < qlen -> r = 0
       :: else ->
          if
          :: owner == c && owner_ep == ep && lock_exp > now ->
             /* granted: reported, not claimed; the grant keeps a claim window */
             if
             :: lock_exp < now + CLAIM -> lock_exp = now + CLAIM
             :: else -> skip
             fi;
             r = 1
          :: else -> r = 2
          fi
       fi;
       k = 0
     }
     if
     :: r == 0 -> s = 0
     :: r == 1 -> atomic { s = 0; r = 0 }; goto acquire  /* the claim: the acquire call */
     :: r == 2 -> r = 0; s = 0; goto next_wait            /* our entry expired: queue anew, as a new entry */
     fi
  :: /* re-check after the holder's TTL (a holder that died releases nothing) */
     goto acquire
  :: /* give up the wait */
     atomic {
       q_find(c, ep);
       if
       :: k < qlen -> q_remove(k); r = 0
       :: else ->
          if
          :: owner == c && owner_ep == ep && lock_exp > now -> r = 1
          :: else -> r = 0
          fi
       fi
     }
     if
     :: r == 1 -> r = 0; goto release_onward
     :: else -> assert(!(owner == c && owner_ep == ep && lock_exp > now)); goto next_wait
     fi
  :: goto dead
  od;

release_onward:
  atomic {
    if
    :: owner == c && owner_ep == ep && lock_exp > now -> grant_head()
    :: else -> skip
    fi
  }
  assert(!(owner == c && owner_ep == ep && lock_exp > now));
  goto next_wait;

holding:
  do
  :: /* renewal */
     s = now;
     atomic {
       if
       :: owner == c && owner_ep == ep && lock_exp > now -> lock_exp = now + TTL; r = 1
       :: else -> r = 0
       fi
     }
     if
     :: r == 1 -> atomic { if :: s + TTL > deadline[c] -> deadline[c] = s + TTL :: else -> skip fi; s = 0; r = 0 }
     :: else -> held[c] = false; s = 0; goto next_wait
     fi
  :: /* release (owner-checked), handing on to the first live waiter */
     held[c] = false;
     atomic {
       if
       :: owner == c && owner_ep == ep && lock_exp > now -> grant_head()
       :: else -> skip
       fi
     }
     goto next_wait
  :: goto dead
  od;

dead:
  held[c] = false;   /* a dead process believes nothing */
done:
  skip
}

proctype Clock() {
  do
  :: now < TMAX -> now++
  :: else -> break
  od
}

/* The invariant, checked in every reachable state. */
#define BELIEVES(c) (held[c] && now < deadline[c])
#define SOUND(c) (!BELIEVES(c) || (owner == c && owner_ep == cur_ep[c] && deadline[c] <= lock_exp))

#if N == 3
#define ALL_SOUND (SOUND(1) && SOUND(2) && SOUND(3))
#else
#define ALL_SOUND (SOUND(1) && SOUND(2))
#endif

/* (4): an unclaimed grant lives at most CLAIM ticks from now. */
#define GRANT_BOUNDED (claimed || owner == 0 || lock_exp <= now + CLAIM)

active proctype Monitor() {
  atomic { !(ALL_SOUND && GRANT_BOUNDED) -> assert(false) }
}

init {
  atomic {
    run Clock();
    run Client(1); run Client(2);
#if N == 3
    run Client(3)
#endif
  }
}
