"""distlock's exceptions: one class per error code of the C++ API (include/distlock/error.hpp).

Every exception the library raises is a :class:`Error`; ``code`` is the C++ ``distlock::errc``
value and the message is the sentence the C++ API gives (never a password).
"""

from __future__ import annotations

__all__ = [
    "Error", "Busy", "Timeout", "Lost", "NotOwner", "Unavailable", "AuthFailed",
    "InvalidArgument", "InvalidUrl", "QuorumUnavailable", "ProtocolError", "NotSupported",
    "Exhausted", "ClockMovedBackwards", "Forked", "Cancelled",
]


class Error(Exception):
    """Base class of every distlock error. ``code``: the C++ ``distlock::errc`` value."""

    code: int = 0


class Busy(Error):
    """The lock is held by another owner: a single attempt (``wait=0``) found it taken."""

    code = 1


class Timeout(Busy):
    """The ``wait`` ran out before the lock was acquired (a :class:`Busy`, so
    ``except distlock.Busy`` catches both)."""

    code = 2


class Lost(Error):
    """The lock was held but its lease ran out or the server dropped it."""

    code = 3


class NotOwner(Error):
    """Release or renewal by somebody who does not hold the lock."""

    code = 4


class Unavailable(Error):
    """The lock service cannot be reached (retrying later may work)."""

    code = 5


class AuthFailed(Error):
    """The server rejected the credentials (retrying will not help)."""

    code = 6


class InvalidArgument(Error, ValueError):
    """A name, duration or option is malformed or out of range."""

    code = 7


class InvalidUrl(Error, ValueError):
    """The backend URL is malformed or names an unknown scheme."""

    code = 8


class QuorumUnavailable(Unavailable):
    """Fewer than a quorum of independent servers answered (redlock://)."""

    code = 9


class ProtocolError(Error):
    """The server answered something distlock did not expect."""

    code = 10


class NotSupported(Error):
    """The backend cannot do this (e.g. a fencing token on redlock://)."""

    code = 11


class Exhausted(Error):
    """A finite resource ran out (worker ids, a day's id counter)."""

    code = 12


class ClockMovedBackwards(Error):
    """The wall clock went back further than tolerated (id generators)."""

    code = 13


class Forked(Error):
    """A client (or id generator) was used in a child process after fork(): connect anew there."""

    code = 14


class Cancelled(Error):
    """The wait was cancelled (the library's ``errc::cancelled``). A Ctrl-C raises
    KeyboardInterrupt and an asyncio cancellation CancelledError instead."""

    code = 15


BY_CODE = {cls.code: cls for cls in (
    Busy, Timeout, Lost, NotOwner, Unavailable, AuthFailed, InvalidArgument, InvalidUrl,
    QuorumUnavailable, ProtocolError, NotSupported, Exhausted, ClockMovedBackwards, Forked,
    Cancelled)}
