"""The asyncio :class:`Watch`: one registered watch of one grant, and the
one end lockd pushes for it (PROTOCOL.md §9.4). :meth:`lockd.Client.watch`
makes it; :class:`lockd.SyncWatch` wraps it for threads."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable, Generator

from .errors import Reason
from ._request import WatchReg

__all__ = ["Watch"]

log = logging.getLogger("lockd")


def reason_of(key: str, token: int, reason: int) -> Reason:
    """The :class:`Reason` of an ``L``'s reason byte; one outside 1..4 (no
    lockd sends it) counts as :attr:`Reason.CANNOT_TELL`: the client cannot
    tell what it means."""
    try:
        return Reason(reason)
    except ValueError:
        log.warning("lockd: L for %r (token %d) with unknown reason %d: taken as 4 (cannot tell)", key, token, reason)
        return Reason.CANNOT_TELL


class Watch:
    """A watch of one grant — ``key`` and its holder's ``token`` — registered
    with lockd (:meth:`lockd.Client.watch` returns it once lockd answered
    ``W``). It ends exactly once:

    - with the reason of the ``L`` lockd pushes when the grant ends:
      :attr:`Reason.RELEASED`, :attr:`Reason.EXPIRED`, :attr:`Reason.FORCED`,
      or :attr:`Reason.CANNOT_TELL` when that member can no longer tell
      (shutting down, stepping down, demoted, frozen);
    - or with :attr:`Reason.CANNOT_TELL` when the connection it was
      registered on is lost (:attr:`error` is then the connection's cause).

    After :attr:`Reason.CANNOT_TELL` the grant may live on where the key is
    served now: watch again (a new :meth:`lockd.Client.watch` goes there; an
    ``N`` then says the grant is gone).

    ``await watch`` (or :meth:`wait`) returns the reason; ``async for reason
    in watch`` yields it once. Use it on the client's event loop.
    """

    def __init__(self, key: str, token: int, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        """The watched grant's key."""
        self.token = token
        """The watched grant's token."""
        self._fut: asyncio.Future[Reason] = loop.create_future()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Reason], None]] = []
        self.reg = WatchReg(self._ended)
        """The registration the watch request carries (internal)."""

    def _ended(self, reason: int, err: BaseException | None) -> None:
        r = reason_of(self.key, self.token, reason)
        self._error = err
        if self._fut.done():
            return
        self._fut.set_result(r)
        cbs, self._callbacks = self._callbacks, []
        for fn in cbs:
            fn(r)

    def done(self) -> bool:
        """Whether the watch ended (or was cancelled)."""
        return self._fut.done()

    @property
    def reason(self) -> Reason | None:
        """How the grant ended; None until it did (or after :meth:`cancel`)."""
        f = self._fut
        if f.done() and not f.cancelled():
            return f.result()
        return None

    @property
    def error(self) -> BaseException | None:
        """Why the watch ended with :attr:`Reason.CANNOT_TELL` without an
        ``L`` (its connection was lost, or the client closed); None
        otherwise."""
        return self._error

    async def wait(self) -> Reason:
        """Wait for the end of the grant and return its reason (cancelling
        the wait leaves the watch running)."""
        return await asyncio.shield(self._fut)

    def __await__(self) -> Generator[object, None, Reason]:
        return self.wait().__await__()

    def __aiter__(self) -> AsyncIterator[Reason]:
        return self._once()

    async def _once(self) -> AsyncIterator[Reason]:
        yield await self.wait()

    def add_done_callback(self, fn: Callable[[Reason], None]) -> None:
        """Call ``fn(reason)`` on the event loop when the watch ends (at once
        if it has)."""
        r = self.reason
        if r is not None:
            fn(r)
        elif not self._fut.done():
            self._callbacks.append(fn)

    def cancel(self) -> None:
        """Stop waiting: :meth:`wait` raises :class:`asyncio.CancelledError`
        and nothing more is called. (lockd keeps the registration until the
        grant ends or the connection closes; it counts toward the
        connection's bound of watches until then.)"""
        self.reg.detach()
        self._callbacks = []
        if not self._fut.done():
            self._fut.cancel()

    def __repr__(self) -> str:
        return f"lockd.Watch(key={self.key!r}, token={self.token}, reason={self.reason!r})"
