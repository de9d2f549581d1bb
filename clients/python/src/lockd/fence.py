"""The resource side of fencing tokens, like the Go package ``fence``.

A protected resource (a store, a file, an account) consults a checker before
it acts for a lock holder, and rejects any token smaller than the largest it
has seen for the same resource. Because lockd's tokens only grow, a holder
whose lease ended while it was paused, and which acts late, is turned away: it
carries a token older than its successor's.

The check and the write it guards must be one atomic step (:meth:`Checker.do`):
a check followed by a separate write leaves a window in which a stale holder
that passed its check writes after its successor. A resource with writers in
several processes must make the comparison part of its own write instead (a
conditional update, "write if token >= the stored token", in one transaction)
and keep the largest token beside the data.

:class:`Validating` (and :class:`SyncValidating`) is the other rule: ask lockd
itself (PROTOCOL.md §9.3, ``V``) whether a token is a current grant before
acting, as the Go package's ``fence.Validating`` does. The largest-token rule
needs no round trip and stays safe across a lock service failover that breaks
mutual exclusion for a moment; validation also turns away a holder whose lease
ended with no successor yet (which the largest-token rule cannot see), at the
cost of a round trip and of trusting lockd's answer. Use both for the
strongest guard: validate, then write through a :class:`Checker`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Awaitable, Callable, Protocol, TypeVar

from .errors import LockdError

__all__ = [
    "StaleToken",
    "Checker",
    "AsyncChecker",
    "NotValid",
    "Validator",
    "SyncValidator",
    "Validating",
    "SyncValidating",
]

T = TypeVar("T")


class StaleToken(LockdError):
    """A token smaller than one already seen for the resource."""

    def __init__(self, resource: str, token: int, largest: int) -> None:
        super().__init__(f"lockd.fence: stale token {token} for {resource!r} (seen {largest})")
        self.resource = resource
        self.token = token
        self.largest = largest


class Checker:
    """Remembers, per resource name, the largest token seen. Thread-safe."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._last: dict[str, int] = {}

    def check(self, resource: str, token: int) -> None:
        """Accept ``token`` for ``resource`` if it is at least the largest seen
        and record it; a smaller one raises :class:`StaleToken` and changes
        nothing. An equal token is accepted (one holder may act several times
        under one grant). ``check`` alone does not make a later write safe;
        use :meth:`do`."""
        with self._mu:
            self._check_locked(resource, token)

    def do(self, resource: str, token: int, write: Callable[[], T]) -> T:
        """Check ``token`` as :meth:`check` does and, if it is accepted, run
        ``write`` before any other check of this checker can pass, and return
        its result. The token is recorded once accepted, whether or not
        ``write`` succeeds. ``write`` must not call the checker."""
        with self._mu:
            self._check_locked(resource, token)
            return write()

    def largest(self, resource: str) -> int:
        """The largest token seen for ``resource``, 0 if none."""
        with self._mu:
            return self._last.get(resource, 0)

    def _check_locked(self, resource: str, token: int) -> None:
        last = self._last.get(resource, 0)
        if token < last:
            raise StaleToken(resource, token, last)
        self._last[resource] = token


class AsyncChecker:
    """:class:`Checker` for asyncio code: :meth:`do` awaits the write while
    holding an :class:`asyncio.Lock`, so the check and the write stay one
    step. Use it from one event loop."""

    def __init__(self) -> None:
        self._mu = asyncio.Lock()
        self._last: dict[str, int] = {}

    async def do(self, resource: str, token: int, write: Callable[[], Awaitable[T]]) -> T:
        """Check ``token`` for ``resource`` (a smaller token than the largest
        seen raises :class:`StaleToken`), record it, and await ``write()``
        before any other :meth:`do` of this checker can pass."""
        async with self._mu:
            last = self._last.get(resource, 0)
            if token < last:
                raise StaleToken(resource, token, last)
            self._last[resource] = token
            return await write()

    def largest(self, resource: str) -> int:
        """The largest token seen for ``resource``, 0 if none."""
        return self._last.get(resource, 0)


class NotValid(LockdError):
    """lockd did not confirm the token as a current grant of the key with
    enough lease left. ``cause`` is the validator's exception (``NotHeld``:
    definitive; ``NoConnection`` and the like: lockd could not be asked), or
    None when the lease left (``left``, seconds) was below ``min_remaining``."""

    def __init__(self, key: str, token: int, cause: BaseException | None = None, left: float = 0.0) -> None:
        why = f"{cause}" if cause is not None else f"{left:.3f} s of lease left"
        super().__init__(f"lockd.fence: token {token} of {key!r} not confirmed: {why}")
        self.key = key
        self.token = token
        self.cause = cause
        self.left = left


class Validator(Protocol):
    """What :class:`Validating` asks: :meth:`lockd.Client.validate` fits."""

    async def validate(self, key: str, token: int, /) -> float:
        """The lease time left of ``token`` as a grant of ``key``, in
        seconds; raises (``NotHeld``, or why lockd could not be asked)."""
        ...


class SyncValidator(Protocol):
    """What :class:`SyncValidating` asks: :meth:`lockd.SyncClient.validate` fits."""

    def validate(self, key: str, token: int, /) -> float:
        """As :meth:`Validator.validate`, blocking."""
        ...


class Validating:
    """Asks lockd before acting for a token (the asyncio side)."""

    def __init__(self, validator: Validator, min_remaining: float = 0.0) -> None:
        self.validator = validator
        #: Lease time (seconds) a token must have left to be accepted.
        self.min_remaining = min_remaining

    async def check(self, key: str, token: int) -> float:
        """Return the lease time left of ``token`` as a grant of ``key``, or
        raise :class:`NotValid`."""
        try:
            left = await self.validator.validate(key, token)
        except LockdError as e:
            raise NotValid(key, token, cause=e) from e
        if left < self.min_remaining:
            raise NotValid(key, token, left=left)
        return left

    async def do(self, key: str, token: int, act: Callable[[], Awaitable[T]]) -> T:
        """Check ``token`` as :meth:`check` does and, once lockd confirmed it,
        await ``act()`` under a deadline at the instant the lease could end
        (when the question was sent plus the time left lockd answered):
        past it, ``act`` is cancelled and :class:`TimeoutError` raised."""
        asked = asyncio.get_running_loop().time()
        left = await self.check(key, token)
        async with asyncio.timeout_at(asked + left):
            return await act()


class SyncValidating:
    """:class:`Validating` for the sync client. :meth:`do` returns the
    deadline to its action instead of enforcing it (a thread cannot be
    cancelled): ``act(deadline)`` gets the ``time.monotonic()`` instant at
    which the lease could end, and should stop by then."""

    def __init__(self, validator: SyncValidator, min_remaining: float = 0.0) -> None:
        self.validator = validator
        #: Lease time (seconds) a token must have left to be accepted.
        self.min_remaining = min_remaining

    def check(self, key: str, token: int) -> float:
        """Return the lease time left of ``token`` as a grant of ``key``, or
        raise :class:`NotValid`."""
        try:
            left = self.validator.validate(key, token)
        except LockdError as e:
            raise NotValid(key, token, cause=e) from e
        if left < self.min_remaining:
            raise NotValid(key, token, left=left)
        return left

    def do(self, key: str, token: int, act: Callable[[float], T]) -> T:
        """Check ``token`` and, once lockd confirmed it, return
        ``act(deadline)``."""
        asked = time.monotonic()
        left = self.check(key, token)
        return act(asked + left)
