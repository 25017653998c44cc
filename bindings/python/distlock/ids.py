"""distlock.ids: unique, increasing ids (the C++ API's four schemes, include/distlock/ids.hpp).

- :class:`Snowflake` — 64-bit ids, 41 bits of milliseconds, 10 bits of worker id, 12 bits of
  sequence; the worker id is a lease taken through any distlock client, so two live generators
  never share one. No round trip per id.
- :class:`RedisDaily` — 64-bit ids, 31 bits of seconds and a per-day counter kept in Redis.
- :class:`Segment` — plain 1, 2, 3, ... from a row of a PostgreSQL or MySQL/MariaDB table,
  taken ``step`` ids per round trip (Leaf's "segment" mode; docs/ids.md).
- :func:`uuid7` — RFC 9562 UUIDv7 (no coordination).

Ids from one generator strictly increase. Generators are thread-safe; in a child after fork()
they raise :class:`distlock.Forked` (make a new one there).

Example::

    import distlock, distlock.ids
    client = distlock.connect("redis://127.0.0.1:6379")
    orders = distlock.ids.Snowflake(client, prefix="orders")
    order_id = orders.next()
    unix_ms, worker, sequence = distlock.ids.decode_snowflake(order_id)
"""

from __future__ import annotations

import uuid
from typing import List, NamedTuple, Optional

from . import Client, NotSupported
from . import _distlock

__all__ = ["Snowflake", "RedisDaily", "Segment", "uuid7", "decode_snowflake", "decode_redis_daily",
           "SnowflakeParts", "RedisDailyParts"]


def _require_ids() -> None:
    if not _distlock.has_ids:
        raise NotSupported("distlock was built without the ids component (DISTLOCK_WITH_IDS=OFF)")


class SnowflakeParts(NamedTuple):
    unix_ms: int
    worker: int
    sequence: int


class RedisDailyParts(NamedTuple):
    unix_seconds: int
    counter: int


class Snowflake:
    """Snowflake ids with a worker id leased through ``client`` (lock ``idgen:<prefix>:worker:<n>``).

    Raises :class:`distlock.Exhausted` when all 1024 worker ids are leased; ``next()`` raises
    :class:`distlock.Lost` once the worker lease is lost (call ``relet()``).
    """

    def __init__(self, client: Client, *, prefix: str = "default", ttl: Optional[float] = None) -> None:
        _require_ids()
        self._impl = _distlock.Snowflake(client._impl, prefix, ttl)

    def next(self) -> int:
        """The next id (no round trip; at most 4096 per millisecond)."""
        return self._impl.next()

    def next_batch(self, n: int) -> List[int]:
        """``n`` consecutive ids."""
        return self._impl.next_batch(n)

    def relet(self) -> None:
        """Leases a worker id again after a loss."""
        self._impl.relet()

    @property
    def worker_id(self) -> int:
        return self._impl.worker_id

    @property
    def leased(self) -> bool:
        """True while the worker lease is held."""
        return self._impl.leased

    def close(self) -> None:
        """Gives the worker id back."""
        self._impl.close()

    def __enter__(self) -> "Snowflake":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisDaily:
    """Ids of 31 bits of seconds and a per-day counter (``INCRBY`` on ``icr:<prefix>:<yyyy:MM:dd>``)
    in the Redis server at ``url``; ``reserve`` ids are taken per round trip."""

    def __init__(self, url: str, *, prefix: str = "id", reserve: int = 1) -> None:
        _require_ids()
        self._impl = _distlock.RedisDaily(url, prefix, reserve)

    def next(self) -> int:
        return self._impl.next()


class Segment:
    """Ids from a database segment: the row ``tag`` of the table ``distlock_segments`` in the
    database at ``url`` (``postgres://``, ``postgresql://`` or ``mysql://``, with an optional
    ``?timeout=DUR``) holds ``max_id``; a generator takes the range ``(max_id, max_id + step]``
    in one committed transaction and hands it out from memory, taking the next range in the
    background when 10 % is left. The table is created at first use.

    - Ids are unique across every generator and process of a tag, and strictly increase within
      one generator; a generator that dies loses the rest of its range (gaps, never repeats).
    - ``step``: ids per range, in [0, 1e9]; 0 takes the row's ``step`` column (1000 for a row
      this generator creates). :meth:`set_step` changes it from the next range on.

    Errors are the module's exceptions with the C++ message (never the password):
    :class:`distlock.InvalidArgument` (tag, step), :class:`distlock.InvalidUrl` (not a database
    URL, unknown query key), :class:`distlock.AuthFailed`, :class:`distlock.Unavailable` (no
    server within the timeouts), :class:`distlock.Exhausted` (max_id would pass 2**63 - 1),
    :class:`distlock.Forked` (used in a child after fork(): make a new one there).
    Thread-safe; ``next()`` releases the GIL.

    Example (``url`` is e.g. ``"postgres://app:pw@db:5432/shop"``;
    bindings/python/tests/test_segment.py runs it)::

        >>> import distlock.ids
        >>> with distlock.ids.Segment(url, "orders", step=1000) as orders:
        ...     first = orders.next()      # one round trip per 1000 ids
        ...     second = orders.next()     # from memory
        >>> second == first + 1
        True
    """

    def __init__(self, url: str, tag: str, *, step: int = 0) -> None:
        _require_ids()
        self._impl = _distlock.Segment(url, tag, step)

    def next(self) -> int:
        """The next id (>= 1). Waits for the database only when the range is used up and the
        next one has not arrived yet."""
        return self._impl.next()

    def set_step(self, step: int) -> None:
        """Ids per range from the next range taken on (0: the row's step)."""
        self._impl.set_step(step)

    @property
    def step(self) -> int:
        """The step asked for (0: the row's)."""
        return self._impl.step

    @property
    def tag(self) -> str:
        return self._impl.tag

    @property
    def round_trips(self) -> int:
        """Ranges taken from the database so far (one round trip each)."""
        return self._impl.round_trips

    def close(self) -> None:
        """Stops the background fetch and closes the connection; the rest of the range is
        lost (never issued by anyone). Further calls raise ``ValueError``."""
        self._impl.close()

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def uuid7() -> uuid.UUID:
    """A UUIDv7 (strictly increasing within this process)."""
    _require_ids()
    return uuid.UUID(bytes=_distlock.uuid7_next())


def decode_snowflake(id: int) -> SnowflakeParts:
    """Splits a snowflake id (default epoch) into (unix_ms, worker, sequence)."""
    _require_ids()
    return SnowflakeParts(*_distlock.decode_snowflake(id))


def decode_redis_daily(id: int) -> RedisDailyParts:
    """Splits a redis-daily id (default epoch) into (unix_seconds, counter)."""
    _require_ids()
    return RedisDailyParts(*_distlock.decode_redis_daily(id))
