"""distlock: distributed locks with fencing tokens and a loss signal, over many stores.

One API over file://, redis://, redis+sentinel://, redis+cluster://, redlock://, etcd://, zk://
and postgres:// (whichever this build has). Every lock is a lease, renewed in the background;
``lease.token`` is a fencing token that strictly increases per lock name, and ``lease.lost`` (a
``threading.Event``) is set when the lease is lost::

    import distlock

    with distlock.connect("redis://127.0.0.1:6379") as client:
        with client.lock("orders/42", ttl=10.0, wait=5.0) as lease:
            write_order(fencing_token=lease.token)   # stop when lease.lost.is_set()

Waiting releases the GIL. On the main thread Ctrl-C (KeyboardInterrupt) ends a wait within
100 ms and leaves nothing queued on the server; ``async with client.alock(...)`` waits without
blocking the event loop, and cancelling the task ends the wait the same way.

Errors are :class:`Error` subclasses, one per error code of the C++ API: :class:`Busy` (and
:class:`Timeout`, a Busy, when ``wait`` runs out), :class:`Unavailable`, :class:`Lost`,
:class:`InvalidUrl`, :class:`InvalidArgument`, :class:`Forked` (a client used in a child after
``fork()``) ...  Messages are the C++ API's own and never contain a password.

Durations are seconds (floats). ``wait=None`` waits for ever, ``wait=0`` makes one attempt.
Thread-safety: a :class:`Client` may be used by any number of threads at once; a :class:`Lease`
belongs to one thread at a time (its ``lost`` event may be watched from any).
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import os
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, TypeVar, Union

from ._errors import (AuthFailed, Busy, Cancelled, ClockMovedBackwards, Error, Exhausted, Forked,
                      InvalidArgument, InvalidUrl, Lost, NotOwner, NotSupported, ProtocolError,
                      QuorumUnavailable, Timeout, Unavailable)
from . import _distlock

__version__ = _distlock.version

__all__ = [
    "connect", "default_url", "Client", "Lease", "MultiLease", "Semaphore", "RWLock", "Election", "Leader",
    "ShardGroup", "ShardAssignment", "OwnedShard",
    "Error", "Busy", "Timeout", "Lost", "NotOwner", "Unavailable", "AuthFailed", "InvalidArgument",
    "InvalidUrl", "QuorumUnavailable", "ProtocolError", "NotSupported", "Exhausted",
    "ClockMovedBackwards", "Forked", "Cancelled",
]


# Every open client, so that leases still held when the interpreter exits are released (as a
# with-block would) instead of blocking others until their TTL runs out. Registered after the
# compiled module's own exit hook, so it runs before it (atexit is last in, first out).
_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


@atexit.register
def _close_all_clients() -> None:
    for client in list(_live_clients):
        try:
            client.close()
        except Exception:
            pass


def default_url() -> str:
    """The URL ``connect(None)`` uses: ``$DISTLOCK_URL``, else the host-local file:// directory."""
    return _distlock.default_url()


def connect(url: Optional[str] = None, *, ttl: Optional[float] = None, wait: Optional[float] = None,
            max_hold: Optional[float] = None, holder_info: Optional[str] = None,
            connect_timeout: Optional[float] = None,
            command_timeout: Optional[float] = None,
            tracer: Optional[Callable[[Dict[str, Any]], None]] = None,
            traceparent: Optional[str] = None) -> "Client":
    """Connects to the lock service named by ``url``.

    ``url=None``: ``$DISTLOCK_URL``, else host-local (file:// in ``$XDG_RUNTIME_DIR/distlock`` or
    ``/tmp/distlock-<uid>``). ``ttl``, ``wait``, ``max_hold`` and ``holder_info`` are the defaults
    of the client's locks (the C++ defaults: ttl 30 s, wait for ever). ``tracer``: called with a
    dict per span of a wait, hold, renewal or loss (docs/tracing.md), on a library thread with the
    GIL held; ``traceparent``: the W3C parent of every lock's spans (a malformed one is ignored
    with a warning). Raises :class:`InvalidUrl` (naming the offending part), :class:`Unavailable`
    or :class:`AuthFailed`.
    """
    return Client(url, ttl=ttl, wait=wait, max_hold=max_hold, holder_info=holder_info,
                  connect_timeout=connect_timeout, command_timeout=command_timeout, tracer=tracer,
                  traceparent=traceparent)


_lost_lock = threading.Lock()


class _LostEvent(threading.Event):
    """``lease.lost``: a threading.Event set when the lease is lost. ``is_set()`` and ``wait()``
    also ask the lease itself, so a lease past its local deadline reads as lost at once, even
    before the client's watchdog thread has declared it (after a pause of the whole process)."""

    def __init__(self, impl: Any) -> None:
        super().__init__()
        self._impl = weakref.ref(impl)

    def _check(self) -> bool:
        impl = self._impl()
        if impl is not None and impl.loss_reason != "none":
            super().set()
        return super().is_set()

    def is_set(self) -> bool:
        return super().is_set() or self._check()

    isSet = is_set

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self.is_set():
            return True
        return super().wait(timeout) or self._check()


_T = TypeVar("_T")


class _ReleasedOnExit:
    """``with``: the object itself; leaving the block calls ``release()``. An error of the
    release is raised only when the block itself raised nothing (its own exception wins)."""

    __slots__ = ()

    def release(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.release()
        except Error:
            if exc_type is None:
                raise


class Lease(_ReleasedOnExit):
    """A held lock (or semaphore permit, read-write hold, election leadership).

    ``token``: the fencing token (int), strictly increasing per lock name across holders; pass it
    to whatever the lock protects. ``lost``: a ``threading.Event`` set when the lease is lost
    (renewal refused, its deadline passed, session gone); never set by an orderly release.
    ``remaining``: seconds until the conservative local deadline (0 when lost or released).

    A context manager: leaving the ``with`` block releases it; releasing a lost lease raises
    :class:`Lost` (unless the block already raised).
    """

    __slots__ = ("_impl", "_name", "_token", "_lost", "__weakref__")

    def __init__(self, impl: Any, name: str) -> None:
        self._impl = impl
        self._name = name
        self._token: Optional[int] = impl.token_or_none
        self._lost: Optional[_LostEvent] = None

    @property
    def lost(self) -> threading.Event:
        """A ``threading.Event`` set when the lease is lost (made on first use; a loss that came
        before is reported at once)."""
        if self._lost is None:
            with _lost_lock:
                if self._lost is None:
                    event = _LostEvent(self._impl)
                    try:
                        self._impl.on_lost(event.set)
                    except NotOwner:
                        pass  # already released: no loss to come (a loss before is in loss_reason)
                    self._lost = event
        return self._lost

    @property
    def name(self) -> str:
        """The lock's name as given."""
        return self._name

    @property
    def token(self) -> int:
        """The fencing token. Raises :class:`NotSupported` where the backend has none (redlock://,
        a reader's hold of a read-write lock). Still readable after the release."""
        if self._token is None:
            return self._impl.token  # raises the reason there is none
        return self._token

    @property
    def has_token(self) -> bool:
        """Whether ``token`` is available."""
        return self._token is not None

    @property
    def held(self) -> bool:
        """True while held and within its local deadline."""
        return self._impl.owns

    @property
    def remaining(self) -> float:
        """Seconds until the local deadline (0.0 when lost or released)."""
        return self._impl.remaining

    @property
    def loss_reason(self) -> str:
        """Why it was lost ("local_deadline", "renewal_refused", ...); "none" while held."""
        return self._impl.loss_reason

    @property
    def loss_detail(self) -> str:
        """One sentence on the loss for people; empty while held."""
        return self._impl.loss_detail

    @property
    def traceparent(self) -> Optional[str]:
        """The W3C traceparent of this hold's span (the parent for work done under the lock), when
        the client has a tracer; else None."""
        return self._impl.traceparent

    def release(self) -> None:
        """Releases now. Raises :class:`Lost` if the lease had been lost (nothing on the server is
        touched then), :class:`Unavailable` if the server could not be reached (the lease then
        ends by its TTL). Releasing twice does nothing."""
        self._impl.release()

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.loss_reason != "none" else "released")
        return f"<distlock.Lease {self._name!r} {state}>"


def _seconds(value: "Union[float, datetime.timedelta, None]") -> Optional[float]:
    """A duration given as seconds or as a ``datetime.timedelta``, in seconds."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


class MultiLease(_ReleasedOnExit):
    """Several names held as one (:meth:`Client.lock_all`): taken all or none, each with its own
    lease and fencing token; a loss of any one name is a loss of the whole.

    ``names``: the names in the order they were taken (sorted, no duplicates). ``tokens``: a dict
    name -> fencing token (empty where the backend has none). ``lost``: a ``threading.Event`` set
    when any one name is lost (``lost_name``, ``loss_reason`` and ``loss_detail`` say which and
    why). A context manager: leaving the ``with`` block releases every name; releasing after a
    loss raises :class:`Lost` (unless the block already raised).
    """

    __slots__ = ("_impl", "_names", "_tokens", "_lost", "_released", "__weakref__")

    def __init__(self, impl: Any) -> None:
        self._impl = impl
        self._names: List[str] = impl.names
        self._tokens: Dict[str, int] = impl.tokens
        self._lost: Optional[_LostEvent] = None
        self._released = False

    @property
    def names(self) -> List[str]:
        return list(self._names)

    @property
    def tokens(self) -> Dict[str, int]:
        """name -> fencing token (strictly increasing per name across holders); still readable
        after the release."""
        return dict(self._tokens)

    def token(self, name: str) -> int:
        """``name``'s fencing token. Raises :class:`InvalidArgument` for a name not held here,
        :class:`NotSupported` where the backend has none."""
        if name in self._tokens:
            return self._tokens[name]
        return self._impl.token(name)

    @property
    def held(self) -> bool:
        """True while every name is held and within its local deadline."""
        return self._impl.owns

    @property
    def remaining(self) -> float:
        """Seconds until the earliest local deadline of its names (0.0 once one is lost)."""
        return self._impl.remaining

    @property
    def lost(self) -> threading.Event:
        """A ``threading.Event`` set when any one of the names is lost (made on first use; a loss
        that came before is reported at once)."""
        if self._lost is None:
            with _lost_lock:
                if self._lost is None:
                    event = _LostEvent(self._impl)
                    try:
                        self._impl.on_lost(event.set)
                    except NotOwner:
                        pass  # already released: no loss to come (a loss before is in loss_reason)
                    self._lost = event
        return self._lost

    @property
    def lost_name(self) -> Optional[str]:
        """The name that was lost (the first in order, if several); None while held."""
        return self._impl.lost_name

    @property
    def loss_reason(self) -> str:
        """Why ``lost_name`` was lost ("revoked", "local_deadline", ...); "none" while held."""
        return self._impl.loss_reason

    @property
    def loss_detail(self) -> str:
        return self._impl.loss_detail

    def release(self) -> None:
        """Releases every name (the last taken first), even when one fails. Raises :class:`Lost`
        if a name had been lost, :class:`Unavailable` if a server could not be reached (that name
        then ends by its TTL). Releasing twice does nothing."""
        if self._released:
            return
        self._released = True
        self._impl.release()

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.loss_reason != "none" else "released")
        return f"<distlock.MultiLease {self._names!r} {state}>"


class _AsyncLock:
    """``async with client.alock(name, ...) as lease:`` (see :meth:`Client.alock`)."""

    def __init__(self, acquire: Any) -> None:
        self._acquire = acquire
        self._lease: Optional[Lease] = None

    async def __aenter__(self) -> Lease:
        loop = asyncio.get_running_loop()
        canceller = _distlock.Canceller()
        future = loop.run_in_executor(None, self._acquire, canceller)
        try:
            self._lease = await asyncio.shield(future)
        except asyncio.CancelledError:
            # End the wait and wait for its thread, so nothing stays queued on the server; a
            # lease granted at the same moment is released.
            canceller.cancel()
            lease = None
            while True:  # the library ends a cancelled wait within one wake-up
                try:
                    lease = await asyncio.shield(future)
                    break
                except asyncio.CancelledError:
                    continue  # cancelled again: still wait for the thread
                except Error:
                    break
            if lease is not None:
                await asyncio.shield(loop.run_in_executor(None, _release_quietly, lease))
            raise
        return self._lease

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, lease.release)
        except Error:
            if exc_type is None:
                raise


def _release_quietly(lease: Lease) -> None:
    try:
        lease.release()
    except Error:
        pass


class Client:
    """A connection to one lock service; make one with :func:`connect`.

    Usable from any number of threads. ``close()`` (or leaving ``with connect(...) as client:``)
    releases the leases still held through it and closes its connections.
    """

    def __init__(self, url: Optional[str] = None, *, ttl: Optional[float] = None,
                 wait: Optional[float] = None, max_hold: Optional[float] = None,
                 holder_info: Optional[str] = None, connect_timeout: Optional[float] = None,
                 command_timeout: Optional[float] = None,
                 tracer: Optional[Callable[[Dict[str, Any]], None]] = None,
                 traceparent: Optional[str] = None) -> None:
        self._impl = _distlock.Client(url or "", connect_timeout, command_timeout, ttl, wait,
                                      max_hold, holder_info, tracer, traceparent)
        self._pid = os.getpid()
        self._groups: "weakref.WeakSet[ShardGroup]" = weakref.WeakSet()
        self._multi: "weakref.WeakSet[MultiLease]" = weakref.WeakSet()
        _live_clients.add(self)

    # -- plain locks ----------------------------------------------------------------------
    def lock(self, name: str, *, ttl: Optional[float] = None, wait: Optional[float] = None,
             max_hold: Optional[float] = None, holder_info: Optional[str] = None,
             lock_delay: "Union[float, datetime.timedelta, None]" = None,
             on_queue_position: Optional[Callable[[int, Dict[str, Any]], None]] = None,
             traceparent: Optional[str] = None) -> Lease:
        """Acquires ``name``, waiting up to ``wait`` seconds (client default: for ever).

        Returns a :class:`Lease` (use it with ``with``). Raises :class:`Busy` when it is held and
        ``wait=0``, :class:`Timeout` (a Busy) when the wait runs out, :class:`Unavailable` when
        the service cannot be reached, :class:`InvalidArgument` for a bad name or ttl. The GIL is
        released while waiting; on the main thread Ctrl-C ends the wait (KeyboardInterrupt)
        within 100 ms and leaves nothing queued.

        ``lock_delay`` (seconds or a ``timedelta``): after this holder is *lost* (killed,
        partitioned, expired, revoked; not after a release) nobody is granted ``name`` before the
        loss plus the delay; the server enforces it (docs/design.md "Lock-delay"). At most 60 s;
        a negative or larger value raises :class:`InvalidArgument`, a backend that cannot enforce
        it :class:`NotSupported`.

        ``on_queue_position(position, ahead)``: called while this call waits in the lock's queue,
        each time its place changes; ``position`` is 1 when it is next, ``ahead`` the one just
        ahead (a dict as ``status()``'s ``waiter_list`` entries; the holder, position 0, when it
        is next). It runs on the client's event thread with the GIL taken, never after ``lock()``
        returned; an exception from it goes to ``sys.unraisablehook`` and the wait goes on. Only
        backends that list their waiters (redis, redis+sentinel, etcd, zk) call it.

        ``traceparent``: the W3C parent of this lock's spans (a client with a ``tracer``).
        """
        return self._track(self._impl.acquire(name, ttl, wait, max_hold, holder_info, None,
                                              _seconds(lock_delay), on_queue_position, traceparent),
                           name)

    def lock_all(self, names: Iterable[str], *, ttl: Optional[float] = None,
                 wait: Optional[float] = None, max_hold: Optional[float] = None,
                 holder_info: Optional[str] = None,
                 lock_delay: "Union[float, datetime.timedelta, None]" = None,
                 traceparent: Optional[str] = None) -> MultiLease:
        """Acquires every one of ``names`` or none, as a :class:`MultiLease` (use it with
        ``with``). The names are taken in sorted order with duplicates dropped, whatever order they
        are given in, so two callers whose sets overlap cannot deadlock (docs/multi_lock.md).
        ``wait`` bounds the whole call: when it cannot have every name by then it releases those
        it took and raises :class:`Timeout` (:class:`Busy` for ``wait=0``). An empty list or an
        empty name raises :class:`InvalidArgument`. ``lock_delay`` and ``traceparent`` apply to
        every name, as in :meth:`lock`. The GIL is released while waiting; Ctrl-C ends the wait on
        the main thread.
        """
        impl = self._impl.acquire_all(list(names), ttl, wait, max_hold, holder_info,
                                      _seconds(lock_delay), traceparent, None)
        multi = MultiLease(impl)
        self._multi.add(multi)
        return multi

    def try_lock(self, name: str, *, ttl: Optional[float] = None, max_hold: Optional[float] = None,
                 holder_info: Optional[str] = None) -> Optional[Lease]:
        """One attempt: a :class:`Lease`, or ``None`` when somebody else holds ``name``."""
        impl = self._impl.try_acquire(name, ttl, max_hold, holder_info)
        return None if impl is None else self._track(impl, name)

    def alock(self, name: str, *, ttl: Optional[float] = None, wait: Optional[float] = None,
              max_hold: Optional[float] = None, holder_info: Optional[str] = None,
              lock_delay: "Union[float, datetime.timedelta, None]" = None,
              on_queue_position: Optional[Callable[[int, Dict[str, Any]], None]] = None,
              traceparent: Optional[str] = None) -> _AsyncLock:
        """``async with client.alock(name, ...) as lease:`` — :meth:`lock` for asyncio.

        The wait runs on the loop's default executor, so the event loop is never blocked;
        cancelling the awaiting task ends the wait and leaves nothing queued on the server.
        ``on_queue_position`` runs on the client's event thread, not in the event loop.
        """
        def acquire(canceller: Any) -> Lease:
            return self._track(self._impl.acquire(name, ttl, wait, max_hold, holder_info, canceller,
                                                  _seconds(lock_delay), on_queue_position,
                                                  traceparent),
                               name)
        return _AsyncLock(acquire)

    # -- primitives ---------------------------------------------------------------------
    def semaphore(self, name: str, permits: int, *, ttl: Optional[float] = None) -> "Semaphore":
        """A counting semaphore of ``permits`` (1..1024) over ``name``. The count is stored on the
        server by the first client that names it; another count raises :class:`InvalidArgument`."""
        return Semaphore(self, name, permits, ttl)

    def rwlock(self, name: str, *, max_readers: int = 0, ttl: Optional[float] = None) -> "RWLock":
        """A read-write lock over ``name``: ``.read()`` / ``.write()`` context managers."""
        return RWLock(self, name, max_readers, ttl)

    def election(self, name: str, *, ttl: Optional[float] = None) -> "Election":
        """A leader election over ``name`` (``campaign``, ``resign``, ``leader``, ``observe``)."""
        return Election(self, name, ttl)

    def shard_group(self, job: str, shards: int, *, ttl: Optional[float] = None,
                    max_hold: Optional[float] = None, rebalance_period: Optional[float] = None,
                    member_id: Optional[str] = None, info: Optional[str] = None,
                    on_change: "Optional[Callable[[ShardAssignment], None]]" = None) -> "ShardGroup":
        """Joins the shard group ``job`` of ``shards`` (1..65536) shards: a :class:`ShardGroup`
        (use it with ``with``; leaving the block leaves the group). See :class:`ShardGroup`.

        ``ttl`` / ``max_hold``: of the membership and shard leases (client defaults);
        ``rebalance_period``: seconds (default 1.0, 0.01 .. 3600). A member that watches its
        group (redis, redis+sentinel, etcd, zk, postgres) re-plans at the watches' events; the
        period is its fallback and retry interval: once a period it re-plans from its view (no
        round trip) to retry what failed (a rejoin, an acquisition), and it re-lists the group
        every max(100 periods, 30 s). Elsewhere (file, mysql, redis+cluster, redlock), or while
        a watch could not be started, the member lists the group once a period.
        ``member_id``: 1..64 bytes of ``[A-Za-z0-9_.-]`` unique in the group (default
        ``<client id>-<n>``); ``info``: shown by status/list. ``on_change(assignment)`` runs on
        the group's thread at each change (keep it short; an exception goes to
        ``sys.unraisablehook``). Joining runs without the GIL. Raises :class:`InvalidArgument`
        (bad job, shard count, option or member id), :class:`Busy` (the member id is in use),
        :class:`NotSupported` (the backend cannot list its locks).
        """
        callback = None
        if on_change is not None:
            user = on_change

            def callback(t: Any) -> None:
                user(ShardAssignment(t))
        group = ShardGroup(_distlock.ShardGroup(self._impl, job, shards, ttl, max_hold,
                                                rebalance_period, member_id, info, callback))
        self._groups.add(group)
        return group

    # -- information ----------------------------------------------------------------------
    def status(self, name: str) -> Dict[str, Any]:
        """What the server knows about ``name``: held, token, ttl_remaining, holder, holder_info,
        waiters (None where the backend does not say), and waiter_list: the waiters in the order
        the lock passes to them, each a dict of position (1: next), owner, holder_info and
        waiting_since (Unix seconds, None where the backend records no time); waiter_list is None
        where the backend keeps no queue (file, postgres, mysql, redis+cluster, redlock)."""
        return self._impl.status(name)

    def revoke(self, name: str, reason: str) -> bool:
        """Ends the lease of whoever holds ``name`` now (any process, any host) and passes the
        lock to the next waiter; the holder learns it at its next renewal (its
        ``loss_reason`` is ``"revoked"``, its loss detail names ``reason``, 1 to 1024 bytes without control characters).
        True when a lease was ended, False when the lock was free (not an error). Raises
        :class:`NotSupported` where the backend cannot end another process's hold (file://,
        postgres://, mysql://). The next holder is granted once the revoked lease has run out
        on the server (at most one TTL): the two never overlap (docs/design.md "Revoke"). Runs without the GIL."""
        return self._impl.revoke(name, reason)

    @property
    def url(self) -> str:
        """The backend URL, with any password masked."""
        return self._impl.url

    @property
    def scheme(self) -> str:
        return self._impl.scheme

    @property
    def has_fencing(self) -> bool:
        """Whether this backend issues fencing tokens."""
        return self._impl.has_fencing

    @property
    def closed(self) -> bool:
        return self._impl.closed

    def close(self) -> None:
        """Releases the leases still held through this client and closes it. Idempotent.
        Clients still open when the interpreter exits are closed then."""
        if self._impl.closed:
            return
        if os.getpid() == self._pid:
            for group in list(self._groups):  # the shard groups joined through it
                group.leave()
            self._impl.release_tracked()  # the leases it returned that are still held
            for multi in list(self._multi):  # and its multi-leases
                try:
                    multi.release()
                except Error:
                    pass  # lost, or the server unreachable: the names end by their TTL
        self._impl.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._impl.closed:
            return "<distlock.Client closed>"
        return f"<distlock.Client {self._impl.url}>"

    def _track(self, impl: Any, name: str) -> Lease:
        # The compiled client already recorded impl for close() (Client.release_tracked).
        return Lease(impl, name)


class Semaphore:
    """At most ``permits`` holders of ``name`` at once; each permit is a :class:`Lease`."""

    def __init__(self, client: Client, name: str, permits: int, ttl: Optional[float]) -> None:
        self._client, self._name, self._ttl = client, name, ttl
        self._permits = client._impl.semaphore_check(name, permits, ttl)

    @property
    def name(self) -> str:
        return self._name

    @property
    def permits(self) -> int:
        return self._permits

    def acquire(self, *, wait: Optional[float] = None) -> Lease:
        """Takes one permit, waiting up to ``wait`` (for ever if None): a :class:`Lease`.
        Raises :class:`Busy` / :class:`Timeout` like :meth:`Client.lock`."""
        impl = self._client._impl.semaphore_acquire(self._name, self._permits, self._ttl, wait,
                                                    None, False)
        return self._client._track(impl, self._name)

    def try_acquire(self) -> Optional[Lease]:
        """One attempt over every permit: a :class:`Lease`, or None when all are held."""
        impl = self._client._impl.semaphore_acquire(self._name, self._permits, self._ttl, 0, None,
                                                    True)
        return None if impl is None else self._client._track(impl, self._name)

    def available(self) -> int:
        """Permits free right now (a snapshot)."""
        return self._client._impl.semaphore_available(self._name, self._permits)

    def __enter__(self) -> Lease:
        self._held = self.acquire()
        return self._held

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._held.__exit__(exc_type, exc, tb)


class RWLock:
    """Many readers or one writer. ``with rw.read():`` / ``with rw.write() as lease:`` (the
    writer's ``lease.token`` is a fencing token; readers have none)."""

    def __init__(self, client: Client, name: str, max_readers: int, ttl: Optional[float]) -> None:
        self._client, self._name, self._max_readers, self._ttl = client, name, max_readers, ttl

    @property
    def name(self) -> str:
        return self._name

    def read(self, *, wait: Optional[float] = None) -> Lease:
        """A shared hold (waits up to ``wait``; Busy / Timeout as :meth:`Client.lock`)."""
        return self._take(False, wait)

    def write(self, *, wait: Optional[float] = None) -> Lease:
        """The exclusive hold (waits up to ``wait``; Busy / Timeout as :meth:`Client.lock`)."""
        return self._take(True, wait)

    def _take(self, exclusive: bool, wait: Optional[float]) -> Lease:
        impl = self._client._impl.rw_acquire(self._name, exclusive, self._max_readers, self._ttl,
                                             wait, None)
        return self._client._track(impl, self._name)


class Leader:
    """Who leads an election: ``value`` (bytes), ``term`` (the leader's fencing token),
    ``holder`` (owner id), ``value_known``, ``ttl_remaining`` (seconds or None)."""

    __slots__ = ("value", "term", "holder", "value_known", "ttl_remaining")

    def __init__(self, d: Dict[str, Any]) -> None:
        self.value: bytes = d["value"]
        self.term: int = d["term"]
        self.holder: str = d["holder"]
        self.value_known: bool = d["value_known"]
        self.ttl_remaining: Optional[float] = d["ttl_remaining"]

    def __repr__(self) -> str:
        return f"<distlock.Leader term={self.term} value={self.value!r}>"


class Election:
    """A leader election: the leader holds a lock whose fencing token is its term."""

    def __init__(self, client: Client, name: str, ttl: Optional[float]) -> None:
        self._client, self._name, self._ttl = client, name, ttl

    @property
    def name(self) -> str:
        return self._name

    def campaign(self, value: "str | bytes", *, wait: Optional[float] = None) -> Lease:
        """Waits (up to ``wait``) until this caller leads, proclaims ``value`` for its term and
        returns the leadership :class:`Lease` (``lease.token`` is the term)."""
        if isinstance(value, str):
            value = value.encode()
        impl = self._client._impl.campaign(self._name, value, self._ttl, wait, None)
        return self._client._track(impl, self._name)

    def proclaim(self, leadership: Lease, value: "str | bytes") -> None:
        """Replaces the leader's value (:class:`NotOwner` when ``leadership`` no longer leads)."""
        if isinstance(value, str):
            value = value.encode()
        self._client._impl.proclaim(self._name, leadership._impl, value)

    def resign(self, leadership: Lease) -> None:
        """Gives up leadership (releases the lease; :class:`Lost` if it had been lost)."""
        self._client._impl.resign(self._name, leadership._impl)

    def leader(self) -> Optional[Leader]:
        """Who leads now, or None."""
        d = self._client._impl.leader(self._name)
        return None if d is None else Leader(d)

    def observe(self, after_term: Optional[int] = None, *,
                wait: Optional[float] = None) -> Optional[Leader]:
        """Waits for a leader whose term is greater than ``after_term``; None when ``wait`` passes."""
        d = self._client._impl.observe(self._name, after_term, wait, None)
        return None if d is None else Leader(d)


# -- shard groups ---------------------------------------------------------------------------
class OwnedShard:
    """One shard a member owns: ``index``, ``token`` (the shard lock's fencing token, strictly
    increasing per shard across owners; pass it to every write the shard makes; ``None`` on a
    backend without tokens), ``owns()`` and ``stopped`` (a ``threading.Event`` set once this
    member no longer owns the shard: given up for a rebalance or a leave, or its lease lost at
    the conservative local deadline, before anyone else can own it)."""

    __slots__ = ("_impl", "index", "token", "stopped")

    def __init__(self, impl: Any) -> None:
        self._impl = impl
        self.index: int = impl.index
        self.token: Optional[int] = impl.token_or_none
        self.stopped = threading.Event()
        impl.on_stop(self.stopped.set)  # at once if it already stopped

    def owns(self) -> bool:
        """True while this member still owns the shard: its lease is held, its conservative local
        deadline has not passed and it was not given up. Read on each call against the deadline
        as renewals move it, so never late: it can turn False before ``stopped`` is set (the
        client's watchdog thread sets that, late in a starved process). Call it right before a
        write that cannot carry the token."""
        return self._impl.owns

    def __repr__(self) -> str:
        state = "owned" if self.owns() else "stopped"
        return f"<distlock.OwnedShard {self.index} token={self.token} {state}>"


class ShardAssignment(Mapping[int, OwnedShard]):
    """What a member owns as of one moment: a mapping shard index -> :class:`OwnedShard` (sorted
    by index), with ``version`` (grows by one at every change; 0 before the first) and
    ``members`` (live members at the last rebalance)."""

    def __init__(self, t: Any) -> None:
        version, members, shards = t
        self.version: int = version
        self.members: int = members
        self._shards: Dict[int, OwnedShard] = {s.index: s for s in (OwnedShard(i) for i in shards)}

    def __getitem__(self, index: int) -> OwnedShard:
        return self._shards[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    @property
    def tokens(self) -> Dict[int, Optional[int]]:
        """index -> token."""
        return {i: s.token for i, s in self._shards.items()}

    def __repr__(self) -> str:
        return f"<distlock.ShardAssignment v{self.version} shards={sorted(self._shards)}>"


class ShardGroup:
    """A member of a shard group (make one with :meth:`Client.shard_group`).

    The job is split into ``shards`` shards; every shard is owned by exactly one live member and
    rebalanced as members join, leave or die (docs/sharding.md). ``assigned()`` is what this
    member owns now; ``wait_change()`` blocks (without the GIL) until that changes. Each shard is
    an ordinary lock: a shard never has two owners whose leases are both valid, and its tokens
    increase from one owner to the next.

    A context manager: leaving the ``with`` block calls :meth:`leave`. Usable from any thread.
    """

    def __init__(self, impl: Any) -> None:
        self._impl = impl
        self._last_version = 0  # of the last assignment returned by assigned() / wait_change()

    @property
    def member_id(self) -> str:
        return self._impl.member_id

    @property
    def job(self) -> str:
        return self._impl.job

    @property
    def shards(self) -> int:
        """The group's shard count."""
        return self._impl.shards

    def assigned(self) -> ShardAssignment:
        """The shards this member owns now. Raises :class:`NotOwner` after :meth:`leave`."""
        now = ShardAssignment(self._impl.assigned())
        self._last_version = now.version
        return now

    def wait_change(self, timeout: Optional[float] = None, *,
                    after_version: Optional[int] = None) -> Optional[ShardAssignment]:
        """Waits until the assignment's version is greater than ``after_version`` and returns it;
        ``None`` when ``timeout`` seconds (None: no limit) passed first. ``after_version``
        defaults to the version of the last assignment this object returned (from
        :meth:`assigned` or :meth:`wait_change`; 0 before any), so that a change between reading
        an assignment and waiting is never missed; with several threads waiting, pass it.
        Raises :class:`NotOwner` once the member left (also during the wait). Runs without the
        GIL; on the main thread Ctrl-C ends it (KeyboardInterrupt) within 100 ms."""
        if after_version is None:
            after_version = self._last_version
        t = self._impl.wait_change(after_version, timeout)
        if t is None:
            return None
        now = ShardAssignment(t)
        self._last_version = now.version
        return now

    def leave(self) -> None:
        """Sets every owned shard's ``stopped``, releases every shard and the membership at
        once and stops the group's thread. Idempotent; never raises (a failed release is left
        to the TTL)."""
        self._impl.leave()

    @property
    def left(self) -> bool:
        return self._impl.left

    def stats(self) -> Dict[str, Any]:
        """Counters: shards_owned, rebalances, shards_taken, shards_given_up, shards_lost,
        membership_lost, list_failures, rejoin_failures (rejoins refused because the member id
        is held; rising past one TTL means another process uses this member id), watching
        (True if the member follows the group by watching it: redis, redis+sentinel, etcd, zk,
        postgres; False if it lists the group every period), watch_gaps (gaps its watches
        reported, each followed by a re-list), safety_relists (a watching member's re-lists
        applied to its view: every max(100 periods, 30 s), and each period while it has lost
        its membership), last_rebalance_time (seconds or None). The same figures as
        metrics()."""
        return self._impl.stats()

    def metrics(self) -> str:
        """stats() in the Prometheus text format (docs/metrics.md)."""
        return self._impl.metrics()

    def __enter__(self) -> "ShardGroup":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.leave()

    def __repr__(self) -> str:
        state = "left" if self._impl.left else "member"
        return f"<distlock.ShardGroup {self.job!r} {self.member_id!r} {state}>"
