"""The client's small shared pieces: :class:`Lock`, argument checks, and the
copy of a shared error. Everything else in the package may import this
module; it imports only :mod:`lockd.errors` and :mod:`lockd.proto`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import errors
from .proto import MAX_KEY, MAX_WAIT

__all__ = ["Lock"]


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
    """

    key: str
    token: int
    expires: float
    lease: int = 0


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
