"""The client's small shared pieces: :class:`Lock`, :class:`Inspection`,
argument checks, and the copy of a shared error. Everything else in the
package may import this module; it imports only :mod:`lockd.errors` and
:mod:`lockd.proto`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from . import errors
from .proto import MAX_KEY, MAX_LIMIT, MAX_WAIT

__all__ = ["Lock", "Inspection"]


@dataclass(frozen=True, slots=True)
class Lock:
    """A granted lock.

    ``token`` is the fencing token: pass it to the resource the lock protects
    (see :mod:`lockd.fence`). ``expires`` is the client's conservative
    estimate of the lease's end, on the event loop's clock (``loop.time()``,
    which is :func:`time.monotonic` for asyncio's default loop and for
    :class:`lockd.SyncClient`): the instant the granting (or last renewing)
    request was sent plus the lease. The server's lease counts from the
    request's arrival or later, so it never ends before ``expires``.
    ``lease`` is that lease in whole seconds; a renewal or ``keep_alive``
    without a lease of its own asks for it again (0, as in a ``Lock`` made by
    hand from a key and a token, means the client's ``default_lease``).
    ``limit`` is the key's limit for a shared grant (one permit of a
    semaphore, a reader of a read/write lock: PROTOCOL.md §9.2), 0 for an
    exclusive one; a shared holder is released, renewed, validated and
    watched like an exclusive one, by its own token.
    """

    key: str
    token: int
    expires: float
    lease: int = 0
    limit: int = 0


@dataclass(frozen=True, slots=True)
class Inspection:
    """A key's state at one moment, as lockd's ``I`` tells it (PROTOCOL.md
    §9.5).

    ``holders`` is the number of holders; ``limit`` the key's limit: 0 when
    it is free, 1 for an exclusive holder (or a key shared with limit 1),
    else the limit its shared holders gave; ``waiters`` the number of queued
    acquires. ``token`` and ``remaining`` are the newest holder's (the
    largest token) token and lease time left in seconds (to the
    millisecond, rounded down), 0 and 0.0 when the key is free.
    """

    key: str
    holders: int
    limit: int
    waiters: int
    token: int
    remaining: float

    @property
    def free(self) -> bool:
        """Whether nobody holds the key."""
        return self.holders == 0


class Grant(Protocol):
    """Anything that names one grant: a :class:`Lock`, a held lock."""

    @property
    def key(self) -> str:
        """The key."""
        ...

    @property
    def token(self) -> int:
        """The grant's token."""
        ...


def grant_of(g: Grant | str, token: int | None) -> tuple[str, int]:
    """``(key, token)`` from a grant, or from a key and a token."""
    if isinstance(g, str):
        if token is None:
            raise errors.InvalidArgument("lockd: a key needs a token: pass (key, token), or a Lock")
        return g, token
    if token is not None:
        raise errors.InvalidArgument("lockd: pass a Lock, or a key and a token, not both")
    return g.key, g.token


def split_addr(a: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port``); raise InvalidArgument."""
    host, sep, port = a.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.InvalidArgument(f"lockd: bad address {a!r}: want host:port")
    return host, int(port)


def check_key(key: str) -> bytes:
    """The key's UTF-8 bytes; raise InvalidKey if it cannot be sent."""
    if not isinstance(key, str):
        raise errors.InvalidKey(f"lockd: key must be a str, not {type(key).__name__}")
    try:
        kb = key.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidKey(f"lockd: key {key!r} is not valid UTF-8") from None
    if not kb or len(kb) > MAX_KEY or b"\n" in kb:
        raise errors.InvalidKey(
            f"lockd: invalid key {key[:64]!r}: want 1..{MAX_KEY} bytes of UTF-8 without a newline"
            f" (it has {len(kb)})"
        )
    return kb


def check_wait(wait: float) -> None:
    """Raise InvalidWait unless ``wait`` is 0..255 seconds."""
    if not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT:
        raise errors.InvalidWait(f"lockd: wait must be 0..255 seconds, not {wait!r}")


def check_limit(limit: int) -> None:
    """Raise InvalidArgument unless ``limit`` is an int in 1..65535."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidArgument(f"lockd: limit must be an int in 1..{MAX_LIMIT}, not {limit!r}")


def lease_secs(lease: float) -> int:
    """``lease`` in whole seconds, rounded up; raise InvalidLease unless it is
    in (0, 255]."""
    if not isinstance(lease, (int, float)) or not 0 < lease <= MAX_WAIT:
        raise errors.InvalidLease(f"lockd: lease must be in (0, 255] seconds, not {lease!r}")
    return math.ceil(lease)


def fresh(err: BaseException) -> BaseException:
    """A copy of a shared error, so that raising it from several tasks does
    not chain their tracebacks together."""
    cls = type(err)
    e = cls.__new__(cls, *err.args)
    e.args = err.args
    e.__dict__.update(err.__dict__)
    e.__traceback__ = None
    return e
