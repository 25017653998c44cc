"""distlock.ids: unique, increasing ids (the C++ API's three schemes, include/distlock/ids.hpp).

- :class:`Snowflake` — 64-bit ids, 41 bits of milliseconds, 10 bits of worker id, 12 bits of
  sequence; the worker id is a lease taken through any distlock client, so two live generators
  never share one. No round trip per id.
- :class:`RedisDaily` — 64-bit ids, 31 bits of seconds and a per-day counter kept in Redis.
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

__all__ = ["Snowflake", "RedisDaily", "uuid7", "decode_snowflake", "decode_redis_daily",
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
