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
"""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, Callable, TypeVar

from .errors import LockdError

__all__ = ["StaleToken", "Checker", "AsyncChecker"]

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
