/* distlock/distlock.h — the C API of distlock: one stable ABI for C programs and for
 * bindings (Go's cgo, ...). Plain C99; opaque handles; no C++ exception ever crosses it.
 *
 * Library: libdistlock_c.so (links libdistlock.so); every symbol is `distlock_*` with the
 * symbol version DISTLOCK_C_0. Build with `pkg-config --cflags --libs distlock-c`, or
 * link `distlock::distlock_c` after `find_package(distlock CONFIG)`.
 *
 * Errors: every call that can fail returns an int status, 0 (DISTLOCK_OK) on success,
 * else a code of the library's error category (include/distlock/error.hpp: busy = 1,
 * timeout = 2, lost = 3, ...) or DISTLOCK_E_NO_MEMORY / DISTLOCK_E_INTERNAL, and fills
 * `*err` (when `err` is not NULL) with the same code and the sentence the C++ API gives
 * ("distlock: invalid URL ..."). No message ever holds a password (URLs are masked).
 *
 * Durations are int64_t milliseconds. Strings are NUL-terminated UTF-8; a string the
 * library returns (char**) is the caller's, freed with distlock_string_free().
 *
 * Thread-safety, in one line per kind of handle (each call below repeats its own):
 *   - distlock_client: every call may be made from any thread at once; close it once,
 *     after the last call on it has returned. Leases outlive their client handle.
 *   - distlock_lease: the queries (token, remaining, owns, lost_fd, loss) and
 *     distlock_lease_on_lost may be called from any thread at once; release and free
 *     from one thread, when no other call on that lease is running.
 *   - distlock_multi_lease: as a lease (queries from any thread; release and free from one).
 *   - distlock_cancel: distlock_cancel_request may be called from any thread at any
 *     time (that is its purpose); free it after the wait that uses it has returned.
 *   - id generators: next() from any thread at once; free once, after the last call.
 *   - distlock_shard_group: every call but free from any thread at once (leave too); free
 *     once, after the last call. An assignment: its queries from any thread; free once.
 *
 * Loss of a lease is signalled three ways: distlock_lease_owns() turns 0 (checked
 * against the local deadline on each call, so it is never late), the descriptor of
 * distlock_lease_lost_fd() becomes readable (an eventfd written on the thread that
 * detects the loss: poll/epoll/select on it, or give it to an event loop), and the
 * callbacks of distlock_lease_on_lost() run (on the client's event thread).
 *
 * Example (bindings/c/tests/example.c, compiled as C99 and run by the c_api test):
 *
 *   distlock_client* client = NULL;
 *   distlock_lease* lease = NULL;
 *   distlock_error err;
 *   if (distlock_connect("redis://127.0.0.1:6379", NULL, &client, &err) != DISTLOCK_OK) {
 *     fprintf(stderr, "%s\n", err.message);
 *     return 1;
 *   }
 *   distlock_lock_options opts;
 *   distlock_lock_options_init(&opts);
 *   opts.ttl_ms = 10000;     // lease length on the server, renewed while held
 *   opts.wait_ms = 5000;     // give up after 5 s (DISTLOCK_E_TIMEOUT)
 *   if (distlock_acquire(client, "orders/42", &opts, &lease, &err) == DISTLOCK_OK) {
 *     uint64_t token = 0;
 *     distlock_lease_token(lease, &token, &err);
 *     write_order(token);                   // pass the fencing token on
 *     distlock_lease_release(lease, &err);  // DISTLOCK_E_LOST if it had been lost
 *     distlock_lease_free(lease);
 *   }
 *   distlock_client_close(client);
 */
#ifndef DISTLOCK_DISTLOCK_H
#define DISTLOCK_DISTLOCK_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define DISTLOCK_C_API __attribute__((visibility("default")))
#else
#define DISTLOCK_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------------------- */
/* The values of distlock::errc (include/distlock/error.hpp); stable. */
#define DISTLOCK_OK 0
#define DISTLOCK_E_BUSY 1                   /* held by another owner; one attempt was asked */
#define DISTLOCK_E_TIMEOUT 2                /* the wait ran out */
#define DISTLOCK_E_LOST 3                   /* the lease was lost */
#define DISTLOCK_E_NOT_OWNER 4              /* not held by the caller */
#define DISTLOCK_E_BACKEND_UNAVAILABLE 5    /* the server cannot be reached */
#define DISTLOCK_E_AUTH_FAILED 6            /* the server rejected the credentials */
#define DISTLOCK_E_INVALID_ARGUMENT 7       /* a name, duration or option is malformed */
#define DISTLOCK_E_INVALID_URL 8            /* malformed URL or unknown scheme */
#define DISTLOCK_E_QUORUM_UNAVAILABLE 9     /* Redlock: no quorum */
#define DISTLOCK_E_PROTOCOL_ERROR 10        /* the server answered something unexpected */
#define DISTLOCK_E_NOT_SUPPORTED 11         /* the backend (or this build) cannot do this */
#define DISTLOCK_E_EXHAUSTED 12             /* ids: a finite resource ran out */
#define DISTLOCK_E_CLOCK_MOVED_BACKWARDS 13 /* ids: the wall clock went back */
#define DISTLOCK_E_FORKED 14                /* used in a child after fork() */
#define DISTLOCK_E_CANCELLED 15             /* the wait was cancelled (distlock_cancel_request) */
/* Not in the C++ category: */
#define DISTLOCK_E_NO_MEMORY 100 /* out of memory */
#define DISTLOCK_E_INTERNAL 101  /* any other failure (the message says what) */

#define DISTLOCK_ERROR_MESSAGE_SIZE 512

/* Filled by every call that takes one: `code` as returned, `message` the C++ API's
 * sentence (truncated to fit, always NUL-terminated; empty on success). */
typedef struct distlock_error {
  int code;
  char message[DISTLOCK_ERROR_MESSAGE_SIZE];
} distlock_error;

/* The name of a status code ("busy", "timeout", ..., "ok"); a static string. Thread-safe. */
DISTLOCK_C_API const char* distlock_status_name(int code);

/* The library's version ("0.1.0"); a static string. Thread-safe. */
DISTLOCK_C_API const char* distlock_version(void);

/* Frees a string returned by this API (NULL is fine). Thread-safe. */
DISTLOCK_C_API void distlock_string_free(char* s);

/* ---- options ------------------------------------------------------------------------ */
/* Values with a meaning of their own: */
#define DISTLOCK_DEFAULT INT64_MIN /* any duration field: the default (the client's, for a lock) */
#define DISTLOCK_WAIT_FOREVER (-1) /* wait_ms: no limit */

typedef struct distlock_cancel distlock_cancel;

/* Per-lock options; initialise with distlock_lock_options_init() (every duration
 * DISTLOCK_DEFAULT: the client's), then set fields. A NULL options pointer means the
 * client's defaults. Values are checked as the C++ API checks them (a ttl of 0 is
 * DISTLOCK_E_INVALID_ARGUMENT naming the field). */
typedef struct distlock_lock_options {
  int64_t ttl_ms;          /* lease length on the server (100 ms .. 366 days) */
  int64_t wait_ms;         /* how long to wait for a busy lock: 0 one attempt (a negative
                              wait is 0), DISTLOCK_WAIT_FOREVER for no limit */
  int64_t max_hold_ms;     /* upper bound on one hold (lost after it; > 0) */
  const char* holder_info; /* shown by status/list (printable ASCII, no '|'); NULL: the
                              client's default */
  distlock_cancel* cancel; /* ends the wait with DISTLOCK_E_CANCELLED when requested;
                              NULL: not cancellable */
} distlock_lock_options;

DISTLOCK_C_API void distlock_lock_options_init(distlock_lock_options* opts);

/* Per-client options; initialise with distlock_client_options_init(). */
typedef struct distlock_client_options {
  int64_t ttl_ms;             /* default lease length; DISTLOCK_DEFAULT: 30 s */
  int64_t wait_ms;            /* default wait; DISTLOCK_DEFAULT: no limit */
  const char* prefix;         /* key prefix, added to the URL as ?prefix=; NULL: the URL's */
  const char* holder_info;    /* default holder_info of every lock; NULL: none */
  int64_t connect_timeout_ms; /* DISTLOCK_DEFAULT: 2 s */
  int64_t command_timeout_ms; /* DISTLOCK_DEFAULT: 2 s */
} distlock_client_options;

DISTLOCK_C_API void distlock_client_options_init(distlock_client_options* opts);

/* ---- cancelling a wait ---------------------------------------------------------------- */
/* A cancel source for waits (one per wait, or shared by several that end together).
 * Once requested it stays requested: make a new one for the next wait. */
DISTLOCK_C_API int distlock_cancel_new(distlock_cancel** out, distlock_error* err);
/* Ends every wait given this source (acquire, semaphore, rwlock, campaign) with
 * DISTLOCK_E_CANCELLED, leaving nothing queued on the server. Async-signal-unsafe, but
 * safe from any thread at any time, also before the wait starts (it then ends at once). */
DISTLOCK_C_API void distlock_cancel_request(distlock_cancel* c);
/* Whether it was requested. Any thread. */
DISTLOCK_C_API int distlock_cancel_requested(const distlock_cancel* c);
/* Frees it; after every wait that uses it has returned. NULL is fine. */
DISTLOCK_C_API void distlock_cancel_free(distlock_cancel* c);

/* ---- client --------------------------------------------------------------------------- */
typedef struct distlock_client distlock_client;
typedef struct distlock_lease distlock_lease;

/* Connects to the backend named by `url` (redis://, etcd://, file:///dir, ...; NULL or ""
 * is $DISTLOCK_URL, else the host-local default). `opts` may be NULL. Any thread. */
DISTLOCK_C_API int distlock_connect(const char* url, const distlock_client_options* opts,
                                    distlock_client** out, distlock_error* err);
/* Frees the handle (the connections close when its last lease is freed). NULL is fine.
 * Once, after every other call on this client has returned. */
DISTLOCK_C_API void distlock_client_close(distlock_client* c);
/* The URL with any password masked; caller frees. Any thread. */
DISTLOCK_C_API int distlock_client_url(distlock_client* c, char** out, distlock_error* err);
/* 1 when the backend issues fencing tokens. Any thread. */
DISTLOCK_C_API int distlock_client_has_fencing(distlock_client* c);

/* ---- locks ----------------------------------------------------------------------------- */
/* Acquires `name`, waiting as opts->wait_ms says. DISTLOCK_E_TIMEOUT when the wait ran out,
 * DISTLOCK_E_BUSY for a wait of 0, DISTLOCK_E_CANCELLED when opts->cancel was requested.
 * Blocks the calling thread; any thread, any number at once. */
DISTLOCK_C_API int distlock_acquire(distlock_client* c, const char* name, const distlock_lock_options* opts,
                                    distlock_lease** out, distlock_error* err);
/* One attempt (opts->wait_ms is ignored): DISTLOCK_E_BUSY while someone else holds it. */
DISTLOCK_C_API int distlock_try_acquire(distlock_client* c, const char* name,
                                        const distlock_lock_options* opts, distlock_lease** out,
                                        distlock_error* err);

/* Revoke: ends the lease of whoever holds `name` now (any process, any host) and passes
 * the lock to the next waiter; the holder learns it at its next renewal (its loss reason is
 * "revoked", with `reason`, 1 to 1024 bytes without control characters). *revoked (may be
 * NULL) is 1 when a lease was ended, 0 when the lock was free (not an error).
 * DISTLOCK_E_NOT_SUPPORTED where the backend
 * cannot end another process's hold (file://, postgres://, mysql://; docs/design.md
 * "Revoke"). The next holder is granted once the revoked lease has run out on the server
 * (at most one TTL): the two never overlap. Any thread. */
DISTLOCK_C_API int distlock_revoke(distlock_client* c, const char* name, const char* reason, int* revoked,
                                   distlock_error* err);

/* The fencing token (strictly increasing per name across holders); DISTLOCK_E_NOT_SUPPORTED
 * where the backend has none (Redlock, a reader's rwlock hold). Any thread. */
DISTLOCK_C_API int distlock_lease_token(const distlock_lease* l, uint64_t* out, distlock_error* err);
/* 1 while held and within the local deadline; 0 once lost or released. Any thread. */
DISTLOCK_C_API int distlock_lease_owns(const distlock_lease* l);
/* Milliseconds until the local deadline (0 when lost or released; INT64_MAX where leases do
 * not expire, file://). Any thread. */
DISTLOCK_C_API int64_t distlock_lease_remaining_ms(const distlock_lease* l);
/* An eventfd that becomes readable (and stays so) when the lease is lost; never by an
 * orderly release. Owned by the lease: do not close or read it; it is closed by
 * distlock_lease_free(). Any thread. */
DISTLOCK_C_API int distlock_lease_lost_fd(const distlock_lease* l);
/* When lost: DISTLOCK_E_LOST with the reason's sentence in *err ("the local deadline
 * passed ..."); DISTLOCK_OK while held (or after an orderly release). Any thread. */
DISTLOCK_C_API int distlock_lease_loss(const distlock_lease* l, distlock_error* err);
/* Runs fn(user) once when the lease is lost (at once if it already is), on the client's
 * event thread, one callback at a time per client. The callback must not free the lease.
 * Any thread. */
DISTLOCK_C_API int distlock_lease_on_lost(distlock_lease* l, void (*fn)(void* user), void* user,
                                          distlock_error* err);
/* Releases now: DISTLOCK_E_LOST if it had been lost (nothing on the server is touched),
 * DISTLOCK_E_BACKEND_UNAVAILABLE if the server could not be reached (it then expires by
 * its TTL). The handle stays valid (owns() is 0) until freed. One thread. */
DISTLOCK_C_API int distlock_lease_release(distlock_lease* l, distlock_error* err);
/* Releases (if still held, errors ignored) and frees. NULL is fine. One thread. */
DISTLOCK_C_API void distlock_lease_free(distlock_lease* l);

/* ---- more lock options: lock-delay, queue position, traceparent ------------------------- */
/* distlock_lock_options keeps its layout for ever (programs built against it allocate its
 * size and call distlock_lock_options_init); settings added later go in
 * distlock_lock_options_ext, which is versioned by its first field: `size` is the
 * sizeof(distlock_lock_options_ext) the caller was compiled with (set by
 * distlock_lock_options_ext_init). The library reads only the fields that lie within `size`
 * and takes the rest as their defaults, so a program built against this header keeps working
 * with a later library whose struct has grown at its end (fields are only ever appended).
 * A `size` smaller than the struct's first version (up to and including traceparent) is
 * DISTLOCK_E_INVALID_ARGUMENT. NULL means every default. */

/* One waiter in a lock's queue (distlock::WaiterInfo). Pointers valid during the call only. */
typedef struct distlock_waiter {
  size_t position;               /* 1 for the waiter the lock goes to next; 0 for the holder */
  const char* owner;             /* its owner id */
  const char* holder_info;       /* its holder_info; NULL when it set none */
  int64_t waiting_since_unix_ms; /* when it joined the queue (server's clock); -1 unknown */
} distlock_waiter;

/* Called while distlock_acquire_ext waits in the queue, each time this waiter's place
 * changes: `position` 1 when it is next; `ahead` the one just ahead (the holder, position 0,
 * when it is next). Runs on the client's event thread (the thread of the distlock_lease_on_lost
 * callbacks), never on the thread that called distlock_acquire_ext, never while a lock of the
 * library is held; it must not block long (it delays loss callbacks) and must not close the
 * client. Only a single-name acquire on a backend that lists its waiters (redis,
 * redis+sentinel, etcd, zk) reports; elsewhere it is never called. */
typedef void (*distlock_queue_position_fn)(size_t position, const distlock_waiter* ahead, void* user_data);

typedef struct distlock_lock_options_ext {
  size_t size;           /* sizeof(distlock_lock_options_ext) as compiled; set by _init */
  int64_t lock_delay_ms; /* after this holder is *lost* (killed, partitioned, expired, revoked;
                            not a release), nobody is granted the name before the loss plus
                            this delay (server-enforced; docs/design.md "Lock-delay").
                            DISTLOCK_DEFAULT: 0 (off); 0 .. 60000; a negative value or more
                            than 60 s is DISTLOCK_E_INVALID_ARGUMENT naming lock_delay; a
                            backend that cannot enforce it: DISTLOCK_E_NOT_SUPPORTED */
  distlock_queue_position_fn on_queue_position; /* NULL: none */
  void* queue_position_user;                    /* passed to on_queue_position */
  const char* traceparent;                      /* parent of the wait and hold spans (as
                                                   distlock_acquire_traced); NULL or "": the
                                                   client's */
} distlock_lock_options_ext;

/* Sets size = sizeof(distlock_lock_options_ext), lock_delay_ms = DISTLOCK_DEFAULT, the rest NULL. */
DISTLOCK_C_API void distlock_lock_options_ext_init(distlock_lock_options_ext* ext);

/* distlock_acquire with the settings of `ext` too (NULL: as distlock_acquire). The queue-position
 * callback runs only during this call: before returning, the call waits for a report in
 * progress and none comes after it, so `queue_position_user` may be freed once it returned
 * (the callback must therefore not wait for this call to return). Any thread. */
DISTLOCK_C_API int distlock_acquire_ext(distlock_client* c, const char* name,
                                        const distlock_lock_options* opts,
                                        const distlock_lock_options_ext* ext, distlock_lease** out,
                                        distlock_error* err);

/* ---- several locks as one: multi-leases (docs/multi_lock.md) ------------------------------ */
/* distlock_acquire_all takes every one of `names` (count of them) or none: in sorted order
 * (bytewise), duplicates dropped, so two callers whose sets overlap cannot deadlock.
 * opts->wait_ms bounds the whole call; a call that cannot have every name by then releases
 * those it took and fails with DISTLOCK_E_TIMEOUT (DISTLOCK_E_BUSY for a wait of 0). Each name
 * keeps its own lease and fencing token; a loss of any one name is a loss of the whole (owns()
 * 0, lost_fd readable). DISTLOCK_E_INVALID_ARGUMENT for count 0 ("the list of names is
 * empty"), a NULL or empty name, a bad option. `ext` may be NULL (its queue-position callback
 * is not called: only single-name acquires report). Blocks; any thread, any number at once. */
typedef struct distlock_multi_lease distlock_multi_lease;
DISTLOCK_C_API int distlock_acquire_all(distlock_client* c, const char* const* names, size_t count,
                                        const distlock_lock_options* opts,
                                        const distlock_lock_options_ext* ext, distlock_multi_lease** out,
                                        distlock_error* err);
/* The number of names held (duplicates dropped), and the i-th in the canonical (sorted)
 * order: a string owned by the multi-lease, valid until it is freed; NULL for i out of range.
 * Any thread. */
DISTLOCK_C_API size_t distlock_multi_lease_count(const distlock_multi_lease* m);
DISTLOCK_C_API const char* distlock_multi_lease_name(const distlock_multi_lease* m, size_t i);
/* `name`'s fencing token: DISTLOCK_E_INVALID_ARGUMENT for a name not held here,
 * DISTLOCK_E_NOT_SUPPORTED where the backend has none (Redlock). Any thread. */
DISTLOCK_C_API int distlock_multi_lease_token(const distlock_multi_lease* m, const char* name, uint64_t* out,
                                              distlock_error* err);
/* 1 while every name is held and within its local deadline; 0 once one is lost or after
 * release. Any thread. */
DISTLOCK_C_API int distlock_multi_lease_owns(const distlock_multi_lease* m);
/* The least time left until a name's local deadline, in ms (0 once one is lost). Any thread. */
DISTLOCK_C_API int64_t distlock_multi_lease_remaining_ms(const distlock_multi_lease* m);
/* An eventfd that becomes readable (and stays so) when any one name is lost; never by an
 * orderly release. Owned by the multi-lease: do not close or read it. Any thread. */
DISTLOCK_C_API int distlock_multi_lease_lost_fd(const distlock_multi_lease* m);
/* When a name was lost: DISTLOCK_E_LOST with a sentence naming it and the reason
 * ("\"b\" lost (revoked): ..."); DISTLOCK_OK while held. Any thread. */
DISTLOCK_C_API int distlock_multi_lease_loss(const distlock_multi_lease* m, distlock_error* err);
/* Releases every name (the reverse of the canonical order), even when one fails:
 * DISTLOCK_E_LOST if a name had been lost, else DISTLOCK_E_BACKEND_UNAVAILABLE if a server
 * could not be reached (that name expires by its TTL). One thread. */
DISTLOCK_C_API int distlock_multi_lease_release(distlock_multi_lease* m, distlock_error* err);
/* Releases (if still held, errors ignored) and frees. NULL is fine. One thread. */
DISTLOCK_C_API void distlock_multi_lease_free(distlock_multi_lease* m);

/* ---- tracing (docs/tracing.md, docs/c.md) ------------------------------------------------ */
/* What a span measured (distlock::SpanKind). */
#define DISTLOCK_SPAN_WAIT 0    /* the acquire call to its outcome (acquiring thread) */
#define DISTLOCK_SPAN_HOLD 1    /* the grant to the release (releasing thread) or the loss */
#define DISTLOCK_SPAN_RENEWAL 2 /* one renewal round of one lease (the client's event thread) */
#define DISTLOCK_SPAN_LOSS 3    /* zero length, when the loss is declared (the event thread) */

/* One finished span, handed to the tracer. Every pointer is valid only during the call:
 * copy what you keep. Strings are NUL-terminated (lock_name may hold the \x1f of a
 * primitive's internal lock). */
typedef struct distlock_span {
  int kind;                /* DISTLOCK_SPAN_* */
  const char* name;        /* "distlock.wait", "distlock.hold", "distlock.renewal", "distlock.loss" */
  char trace_id[33];       /* 32 lowercase hex digits */
  char span_id[17];        /* 16 lowercase hex digits */
  char parent_span_id[17]; /* 16 hex digits; "" for a root span */
  char traceparent[56];    /* this span's W3C traceparent, "00-<trace>-<span>-<flags>" */
  int sampled;             /* the trace flags' sampled bit */
  int64_t start_unix_ns;   /* wall clock (read once at the start; end = start + length) */
  int64_t end_unix_ns;
  int64_t start_mono_ns; /* the client's clock (CLOCK_BOOTTIME): end - start is the length */
  int64_t end_mono_ns;
  const char* lock_name;
  int has_token; /* 1 when `token` is set (after the grant, backends with tokens) */
  uint64_t token;
  const char* owner;       /* the owner id on the server ("" for a wait that got none) */
  const char* holder_info; /* "" when none */
  const char* backend;     /* the URL scheme: "redis", "file", ... */
  const char* outcome;     /* "acquired", "busy", "timed_out", "cancelled", "error", "released",
                              "lost", "renewed", "refused", "failed" */
  int error_code;          /* a DISTLOCK_E_* code for an outcome "error"/"failed"; else 0 */
  const char* loss_reason; /* "none" unless lost: the reason's name (distlock::to_string(LossReason)) */
  const char* detail;      /* one sentence for people; may be "" */
  uint32_t batch_size;     /* renewal: the leases renewed in the round's one batch */
} distlock_span;

/* Receives every finished span of a client, on the threads named above (several at once:
 * make it thread-safe). It must not call distlock_client_close on its own client. A slow
 * tracer delays the call it runs in (an acquire or a release) and the client's loss
 * callbacks (distlock_lease_on_lost), never a renewal or a loss signal. */
typedef void (*distlock_tracer_fn)(const distlock_span* span, void* user_data);

/* distlock_connect with a tracer (`tracer` NULL: none) and a client-wide parent
 * `traceparent` (NULL or "": none). A malformed traceparent is ignored with a warning on
 * the client's log, never an error. `user_data` is passed to every call of `tracer`;
 * `release_user_data` (NULL: none) is called with it once, when no span can come any more:
 * after distlock_client_close and the release (or, at the latest, the freeing) of the
 * client's last lease; a lease released after the close still gives its spans first. It is
 * also called when the connect fails.
 * Any thread. */
DISTLOCK_C_API int distlock_connect_traced(const char* url, const distlock_client_options* opts,
                                           distlock_tracer_fn tracer, void* user_data,
                                           void (*release_user_data)(void* user_data),
                                           const char* traceparent, distlock_client** out,
                                           distlock_error* err);
/* distlock_acquire whose wait and hold spans have `traceparent` as their parent (NULL or "":
 * the client's; malformed: ignored with a warning). */
DISTLOCK_C_API int distlock_acquire_traced(distlock_client* c, const char* name,
                                           const distlock_lock_options* opts, const char* traceparent,
                                           distlock_lease** out, distlock_error* err);
/* The traceparent of the lease's hold span (the parent for the work done under the lock);
 * caller frees with distlock_string_free. *out is NULL when the client has no tracer (and
 * for a read-write lock hold). Any thread. */
DISTLOCK_C_API int distlock_lease_traceparent(const distlock_lease* l, char** out, distlock_error* err);

/* ---- semaphore, read-write lock, election ---------------------------------------------- */
/* Takes one of `permits` (1..1024) permits of the semaphore `name` (the count is stored by
 * the first client; another count is DISTLOCK_E_INVALID_ARGUMENT). The lease is one permit.
 * Waits like distlock_acquire. Any thread. */
DISTLOCK_C_API int distlock_semaphore_acquire(distlock_client* c, const char* name, int permits,
                                              const distlock_lock_options* opts, distlock_lease** out,
                                              distlock_error* err);
/* A hold of the read-write lock `name`: exclusive (a writer; its token is the writer's
 * fencing token) or shared (a reader; no token). max_readers: 0 = the stored value (32 for
 * a new lock), else 1..1024. Waits like distlock_acquire. Any thread. */
DISTLOCK_C_API int distlock_rwlock_acquire(distlock_client* c, const char* name, int exclusive,
                                           int max_readers, const distlock_lock_options* opts,
                                           distlock_lease** out, distlock_error* err);
/* Campaigns in the election `name` with `value`: returns the leadership lease once this
 * caller leads (its token is the term). Waits like distlock_acquire. Any thread. */
DISTLOCK_C_API int distlock_election_campaign(distlock_client* c, const char* name, const char* value,
                                              const distlock_lock_options* opts, distlock_lease** out,
                                              distlock_error* err);
/* Gives up leadership (releases the lease; DISTLOCK_E_LOST if it had been lost). The
 * lease must come from distlock_election_campaign with the same name. One thread. */
DISTLOCK_C_API int distlock_election_resign(distlock_client* c, const char* name, distlock_lease* leadership,
                                            distlock_error* err);
/* Who leads now, as JSON: {"value":"...","term":7,"holder":"...","value_known":true,
 * "ttl_remaining_ms":900} or the text null (nobody). Caller frees. Any thread. */
DISTLOCK_C_API int distlock_election_leader(distlock_client* c, const char* name, char** json,
                                            distlock_error* err);
/* Replaces the leader's value for its term. DISTLOCK_E_NOT_OWNER, and nothing written, when
 * the leadership is no longer held (lost, released, past its local deadline);
 * DISTLOCK_E_INVALID_ARGUMENT when the lease is not a leadership of this election. Any
 * thread, but not while the lease is released or freed. */
DISTLOCK_C_API int distlock_election_proclaim(distlock_client* c, const char* name,
                                              const distlock_lease* leadership, const char* value,
                                              distlock_error* err);
/* Waits until it reads a leader whose term is greater than *after_term (any leader when
 * after_term is NULL) and returns it as distlock_election_leader's JSON; the text null when
 * opts->wait_ms passes first (DISTLOCK_DEFAULT: the client's wait; DISTLOCK_WAIT_FOREVER: no
 * limit). opts->cancel ends the wait (DISTLOCK_E_CANCELLED). Calling it again with the term
 * it returned gives leaders in strictly increasing term order, never one the server had
 * already ended; leaders that win and go between two reads are missed (election.hpp).
 * DISTLOCK_E_NOT_SUPPORTED on backends without fencing tokens. Caller frees. Any thread. */
DISTLOCK_C_API int distlock_election_observe(distlock_client* c, const char* name, const uint64_t* after_term,
                                             const distlock_lock_options* opts, char** json,
                                             distlock_error* err);

/* ---- status and list --------------------------------------------------------------------- */
/* What the backend knows about `name`, as JSON: {"held":true,"token":3,"ttl_remaining_ms":
 * 2900,"holder":"...","holder_info":"...","waiters":0} (unknown fields are left out).
 * Where the backend lists its queue (redis, redis+sentinel, etcd, zk) it adds "queue": the
 * waiters in hand-off order, [{"position":1,"owner":"...","holder_info":"...",
 * "waiting_since_unix_ms":...}] (holder_info and waiting_since_unix_ms left out when unknown).
 * Caller frees. Any thread. */
DISTLOCK_C_API int distlock_status_json(distlock_client* c, const char* name, char** json,
                                        distlock_error* err);
/* Locks held now whose name starts with `prefix` (NULL or "": all), at most `limit`, as
 * JSON: {"locks":[{"name":..., "base":..., "kind":"lock", "display":..., "held":true,
 * "token":...}, ...], "truncated":false}. DISTLOCK_E_NOT_SUPPORTED where the backend
 * cannot list. Caller frees. Any thread. */
DISTLOCK_C_API int distlock_list_json(distlock_client* c, const char* prefix, size_t limit, char** json,
                                      distlock_error* err);

/* ---- shard groups ---------------------------------------------------------------------- */
/* Task sharding (include/distlock/shard_group.hpp, docs/sharding.md): one job split into
 * `shards` shards run by several members at once, each shard owned by exactly one live
 * member, rebalanced as members join, leave or die. Each owned shard is an ordinary lock
 * with its own fencing token: pass it to every write the shard makes.
 * DISTLOCK_E_NOT_SUPPORTED on a backend that cannot list its locks (Redlock). */
typedef struct distlock_shard_group distlock_shard_group;
typedef struct distlock_shard_assignment distlock_shard_assignment;

/* Per-member options; initialise with distlock_shard_group_options_init() (every duration
 * DISTLOCK_DEFAULT, every string NULL). A NULL options pointer means the defaults. */
typedef struct distlock_shard_group_options {
  int64_t ttl_ms;              /* lease length of the membership and of each shard; DISTLOCK_DEFAULT:
                                  the client's */
  int64_t max_hold_ms;         /* upper bound on one hold of a shard; DISTLOCK_DEFAULT: none */
  int64_t rebalance_period_ms; /* 10 ms .. 1 h; DISTLOCK_DEFAULT: 1 s. A member that watches its
                                  group (redis, redis+sentinel, etcd, zk, postgres) rebalances at
                                  the watches' events; once a period it re-plans from its view (no
                                  round trip) to retry a failed rejoin or acquisition, and re-lists
                                  the group every max(100 periods, 30 s). Elsewhere (file, mysql,
                                  redis+cluster, redlock), or while a watch could not be started,
                                  it lists the group once a period (docs/sharding.md) */
  const char* member_id;       /* 1..64 bytes of [A-Za-z0-9_.-], unique in the group; NULL: "<client
                                  id>-<n>" */
  const char* info;            /* shown by status/list in the membership lock (printable ASCII, no
                                  '|'); NULL: none */
} distlock_shard_group_options;

/* One shard of an assignment. */
typedef struct distlock_owned_shard {
  uint32_t index; /* 0 .. shards-1 */
  int has_token;  /* 1 when the backend issues fencing tokens */
  uint64_t token; /* the shard lock's fencing token (strictly increasing per shard across
                     owners); 0 when has_token is 0 */
  int stopped_fd; /* an eventfd that becomes readable (and stays so) once this member no
                     longer owns the shard: given up for a rebalance or a leave, or its lease
                     lost (at the conservative local deadline, before anyone else can own it).
                     Opened by the first distlock_shard_assignment_shard call for this shard of
                     this assignment. Owned by the assignment: do not close or read it */
} distlock_owned_shard;

DISTLOCK_C_API void distlock_shard_group_options_init(distlock_shard_group_options* opts);

/* Joins the shard group `job` of `shards` shards (1..65536): takes the membership lock and
 * starts the member's thread (the first rebalance runs at once; shards come in the
 * background: read them with distlock_shard_group_assigned / _wait_change).
 * DISTLOCK_E_INVALID_ARGUMENT for an empty or bad job name, a shard count outside 1..65536,
 * a bad option or member id; DISTLOCK_E_BUSY when the member id is in use. The group keeps the
 * connection alive: the client may be closed before it. Any thread. */
DISTLOCK_C_API int distlock_shard_group_join(distlock_client* c, const char* job, uint32_t shards,
                                             const distlock_shard_group_options* opts,
                                             distlock_shard_group** out, distlock_error* err);
/* The shards this member owns now. DISTLOCK_E_NOT_OWNER after distlock_shard_group_leave.
 * Caller frees with distlock_shard_assignment_free. Any thread. */
DISTLOCK_C_API int distlock_shard_group_assigned(distlock_shard_group* g, distlock_shard_assignment** out,
                                                 distlock_error* err);
/* Waits until the assignment's version is greater than `after_version` and returns it:
 * DISTLOCK_E_TIMEOUT when `timeout_ms` (DISTLOCK_WAIT_FOREVER, or 100 years or more: no limit) passed first,
 * DISTLOCK_E_CANCELLED when `cancel` (may be NULL) was requested, DISTLOCK_E_NOT_OWNER when the
 * member left (before or during the wait). Any thread, any number at once. */
DISTLOCK_C_API int distlock_shard_group_wait_change(distlock_shard_group* g, uint64_t after_version,
                                                    int64_t timeout_ms, distlock_cancel* cancel,
                                                    distlock_shard_assignment** out, distlock_error* err);
/* An eventfd that becomes readable at every change of the assignment (and at leave); read
 * its 8-byte counter to clear it, then call distlock_shard_group_assigned. Owned by the
 * group: do not close it; closed by distlock_shard_group_free. Any thread. */
DISTLOCK_C_API int distlock_shard_group_changed_fd(const distlock_shard_group* g);
/* This member's id (the option's, or the generated one); a string owned by the group,
 * valid until it is freed. Any thread. */
DISTLOCK_C_API const char* distlock_shard_group_member_id(const distlock_shard_group* g);
/* Fires every shard's stopped_fd, releases every shard and the membership at once and stops
 * the member's thread; waits in distlock_shard_group_wait_change end with
 * DISTLOCK_E_NOT_OWNER. Idempotent (a failed release is left to the TTL). Any thread. */
DISTLOCK_C_API void distlock_shard_group_leave(distlock_shard_group* g);
/* Leaves (if not yet) and frees. NULL is fine. Once, after every other call on the group has
 * returned; assignments read from it stay valid until freed. */
DISTLOCK_C_API void distlock_shard_group_free(distlock_shard_group* g);

/* An assignment: a snapshot of one moment. `version` grows by one at every change (0 before
 * the first), `members` the live members at the last rebalance. Any thread. */
DISTLOCK_C_API uint64_t distlock_shard_assignment_version(const distlock_shard_assignment* a);
DISTLOCK_C_API size_t distlock_shard_assignment_members(const distlock_shard_assignment* a);
/* The number of shards owned, and the i-th of them (0 <= i < count; sorted by index). The
 * first call for a shard opens its stopped_fd; when the process is out of descriptors it fails
 * with DISTLOCK_E_INTERNAL naming the eventfd, with index and token filled and stopped_fd -1. */
DISTLOCK_C_API size_t distlock_shard_assignment_count(const distlock_shard_assignment* a);
DISTLOCK_C_API int distlock_shard_assignment_shard(const distlock_shard_assignment* a, size_t i,
                                                   distlock_owned_shard* out, distlock_error* err);
/* 1 while this member still owns the i-th shard: its lease is held, its conservative local
 * deadline has not passed and it was not given up; 0 otherwise, or for an i out of range.
 * Read at the call against the deadline as renewals move it (OwnedShard::held()), so never
 * late: it can turn 0 before stopped_fd becomes readable (that is written by the client's
 * watchdog thread, late in a starved process). Call it right before a write that cannot carry
 * the token. Any thread. */
DISTLOCK_C_API int distlock_shard_assignment_owns(const distlock_shard_assignment* a, size_t i);
/* An opaque non-zero id of the i-th shard's ownership (one acquisition of the shard by this
 * member): two assignments alive at the same time give the same id exactly when they list the
 * same ownership, so a caller that reads the assignment again after each change can keep one
 * watcher per ownership instead of one per shard per assignment (the Go binding does). An id
 * may be reused once no assignment listing it is alive. 0 for an i out of range. Any thread. */
DISTLOCK_C_API uint64_t distlock_shard_assignment_ownership(const distlock_shard_assignment* a, size_t i);
/* Frees it (closes its descriptors). NULL is fine. */
DISTLOCK_C_API void distlock_shard_assignment_free(distlock_shard_assignment* a);

/* ---- ids ----------------------------------------------------------------------------------- */
/* DISTLOCK_E_NOT_SUPPORTED when the library was built without its ids component. */
typedef struct distlock_snowflake distlock_snowflake;
typedef struct distlock_redis_daily distlock_redis_daily;

/* Snowflake ids with a worker id leased through the client (prefix: the worker-id space;
 * NULL: "default"). next(): any thread at once; free once. */
DISTLOCK_C_API int distlock_snowflake_new(distlock_client* c, const char* prefix, distlock_snowflake** out,
                                          distlock_error* err);
DISTLOCK_C_API int distlock_snowflake_next(distlock_snowflake* g, uint64_t* out, distlock_error* err);
DISTLOCK_C_API void distlock_snowflake_free(distlock_snowflake* g);
/* The seed document's day-counter ids over one Redis server (redis_url: redis://...;
 * prefix NULL: "id"; reserve: ids per round trip, 0 means 1). */
DISTLOCK_C_API int distlock_redis_daily_new(const char* redis_url, const char* prefix, uint32_t reserve,
                                            distlock_redis_daily** out, distlock_error* err);
DISTLOCK_C_API int distlock_redis_daily_next(distlock_redis_daily* g, uint64_t* out, distlock_error* err);
DISTLOCK_C_API void distlock_redis_daily_free(distlock_redis_daily* g);
/* Ids from a database segment (distlock::ids::SegmentGenerator): plain 1, 2, 3, ... of the
 * row `tag` of distlock_segments at url (postgres://... or mysql://...); step: ids per
 * database round trip, 0 means the row's step. next(): any thread at once; in a forked
 * child DISTLOCK_E_FORKED. free once. */
typedef struct distlock_segment distlock_segment;
DISTLOCK_C_API int distlock_segment_new(const char* url, const char* tag, int64_t step,
                                        distlock_segment** out, distlock_error* err);
DISTLOCK_C_API int distlock_segment_next(distlock_segment* g, uint64_t* out, distlock_error* err);
/* Ids per database round trip from the next range taken on (0: the row's step);
 * DISTLOCK_E_INVALID_ARGUMENT (nothing changes) outside [0, 1e9]. One call at a time per
 * generator; next() may run at once. */
DISTLOCK_C_API int distlock_segment_set_step(distlock_segment* g, int64_t step, distlock_error* err);
DISTLOCK_C_API void distlock_segment_free(distlock_segment* g);
/* A UUIDv7 in canonical text (36 characters and a NUL) from one process-wide generator:
 * strictly increasing within the process. Any thread. */
DISTLOCK_C_API int distlock_uuid7(char out[37], distlock_error* err);

#ifdef __cplusplus
}
#endif

#endif /* DISTLOCK_DISTLOCK_H */
