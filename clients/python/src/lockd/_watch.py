"""Watches (PROTOCOL.md §9.4): the :class:`Watcher` that keeps one grant
watched until it ends — registering again where the key is served now when
a registration lapses —, which held locks use too, and the asyncio
:class:`Watch` that :meth:`lockd.Client.watch` returns (:class:`lockd.SyncWatch`
wraps it for threads)."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, AsyncIterator, Callable, Generator

from . import errors
from ._request import WatchReg
from .errors import GrantEnded, Reason

if TYPE_CHECKING:
    from ._ops import Core

__all__ = ["Watch"]

log = logging.getLogger("lockd")

# A registration that lapses sooner than this after its W was answered is
# followed after the client's retry_pause, not at once: a member that keeps
# saying it cannot tell is not asked in a tight loop.
MIN_REGISTRATION = 0.1


class Watcher:
    """Keeps one grant watched until it ends: a registration (``W``) in
    force, and another one — where the key is served now: the request
    follows ``M`` — whenever one lapses without the grant's end (an ``L``
    with reason 4, or another reason it does not know; its connection
    lost). It ends, once, with the :class:`GrantEnded` of an ``L`` 1–3, or
    with the error that stopped it: :class:`NotHeld` (a registration found
    the grant gone: it ended while no one could tell how),
    :class:`WatchLimit` (unless ``limit_retry``: then it tries again that
    much later), :class:`Unsupported`, :class:`PermissionDenied`,
    :class:`Unauthenticated`, :class:`Closed`. No connection, no answer in
    time and ``E`` 4 are tried again after the client's ``retry_pause``.
    ``on_lapse(reason, err)`` is called when a registration lapses — the
    ``L``'s reason, or 4 and the connection's cause — (a held lock renews at
    once: its renewal confirms or denies the grant where it is served
    now). ``on_end`` gets what it ended with; nothing after :meth:`stop`.
    All on the client's loop."""

    def __init__(
        self,
        core: Core,
        key: str,
        token: int,
        on_end: Callable[[GrantEnded | BaseException], None],
        on_lapse: Callable[[int, BaseException | None], None] | None = None,
        limit_retry: float = 0.0,
    ) -> None:
        self.core = core
        self.key = key
        self.token = token
        self.on_end: Callable[[GrantEnded | BaseException], None] | None = on_end
        self.on_lapse = on_lapse
        self.limit_retry = limit_retry
        self.kick = asyncio.Event()
        self.reg: WatchReg | None = None
        self.task: asyncio.Task[None] | None = None
        self.stopped = False

    async def register(self) -> WatchReg:
        """One registration: a ``W`` sent (and sent again) until lockd
        answered it; raises what :meth:`Core.watch` raises."""
        reg = WatchReg(None)
        reg.cb = functools.partial(self._lapse, reg)
        self.reg = reg
        try:
            await self.core.watch(self.key, self.token, reg)
        except BaseException:
            reg.detach()
            if self.reg is reg:
                self.reg = None
            raise
        return reg

    def _lapse(self, reg: WatchReg, reason: int, err: BaseException | None) -> None:
        if reg is self.reg:
            self.kick.set()

    def start(self, reg: WatchReg | None) -> None:
        """Follow the grant in the background from ``reg`` (None: register
        first)."""
        self.task = self.core.spawn(self._run(reg))

    async def _run(self, reg: WatchReg | None) -> None:
        core = self.core
        loop = core.loop
        since = loop.time()
        while not self.stopped:
            if reg is None:
                try:
                    reg = await self.register()
                except errors.LockdError as e:
                    if not await self._retry(e):
                        return
                    continue
                since = loop.time()
                core.unwatched = False
            if not reg.ended:
                self.kick.clear()
                await self.kick.wait()
                continue
            reason = reg.reason
            if reg.err is None and Reason.RELEASED <= reason <= Reason.FORCED:
                self._end(GrantEnded(self.key, self.token, Reason(reason)))
                return
            if isinstance(reg.err, errors.Closed) or core.closed:
                self._end(errors.Closed("lockd: client closed"))
                return
            # The member can no longer tell (4), or the connection ended:
            # the grant may live on where the key is served now.
            err = reg.err
            reg = None
            self.reg = None
            if self.on_lapse is not None:
                self.on_lapse(reason, err)
            if loop.time() - since < MIN_REGISTRATION and not await core.pool.sleep(
                core.st.retry_pause, loop.time() + core.st.retry_pause + 1
            ):
                self._end(errors.Closed("lockd: client closed"))
                return

    async def _retry(self, err: errors.LockdError) -> bool:
        """After a failed registration: True once it may be tried again,
        False when the watch ended with ``err``."""
        core = self.core
        if isinstance(err, errors.Closed) or core.closed:
            self._end(errors.Closed("lockd: client closed"))
            return False
        if isinstance(err, errors.WatchLimit):
            if self.limit_retry <= 0:
                self._end(err)
                return False
            pause = self.limit_retry
            # Once in a row at WARNING: with many locks, one line says it.
            log.log(
                logging.DEBUG if core.unwatched else logging.WARNING,
                "lockd: %r (token %d) is not watched: %s; trying again in %.1f s, its renewals guard it meanwhile",
                self.key,
                self.token,
                err.message,
                pause,
            )
            core.unwatched = True
        elif isinstance(err, (errors.NoConnection, errors.Timeout)) or (
            isinstance(err, errors.ServerError) and err.code == 4
        ):
            pause = core.st.retry_pause  # between members, or redialling
        else:
            self._end(err)  # NotHeld, Unsupported, PermissionDenied, ...
            return False
        if not await core.pool.sleep(pause, core.loop.time() + pause + 1):
            self._end(errors.Closed("lockd: client closed"))
            return False
        return True

    def _end(self, result: GrantEnded | BaseException) -> None:
        fn, self.on_end = self.on_end, None
        self.stopped = True
        if fn is not None:
            fn(result)

    def stop(self) -> None:
        """Stop following the grant: nothing more is called. (lockd keeps a
        registration until the grant ends or its connection closes; it
        counts toward the connection's bound of watches until then.)"""
        self.stopped = True
        self.on_end = None
        self.on_lapse = None
        if self.reg is not None:
            self.reg.detach()
            self.reg = None
        t = self.task
        if t is not None and not t.done() and t is not asyncio.current_task():
            t.cancel()


class Watch:
    """A watch of one grant — ``key`` and its holder's ``token`` — from
    :meth:`lockd.Client.watch`, registered with lockd when it is returned.
    It follows the grant until it ends, and ends once:

    - with the :class:`Reason` of the ``L`` lockd pushes when the grant
      ends: :attr:`Reason.RELEASED`, :attr:`Reason.EXPIRED`,
      :attr:`Reason.FORCED`;
    - or with an error (:attr:`error`): :class:`NotHeld` when the grant
      was gone by the time the watch could ask again (it ended while no one
      could tell how), :class:`WatchLimit`, :class:`Unsupported`,
      :class:`PermissionDenied`, :class:`Unauthenticated`, :class:`Closed`.

    When the member it is registered on can no longer tell (an ``L`` with
    reason 4: shutting down, stepping down, demoted, frozen) or the
    connection is lost, the grant may live on where the key is served now:
    the watch registers again there by itself (following ``M``), and goes
    on.

    ``await watch`` (or :meth:`wait`) returns the reason or raises the
    error; ``async for reason in watch`` yields the reason once. Use it on
    the client's event loop.
    """

    def __init__(self, core: Core, key: str, token: int) -> None:
        self.key = key
        """The watched grant's key."""
        self.token = token
        """The watched grant's token."""
        self._fut: asyncio.Future[Reason] = core.loop.create_future()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Watch], None]] = []
        self._w = Watcher(core, key, token, self._ended)

    async def _start(self) -> None:
        """Register, then follow the grant in the background."""
        reg = await self._w.register()
        self._w.start(reg)

    def _ended(self, result: GrantEnded | BaseException) -> None:
        if self._fut.done():
            return
        if isinstance(result, GrantEnded):
            self._fut.set_result(result.reason)
        else:
            self._error = result
            self._fut.set_exception(result)
            self._fut.exception()  # retrieved: the error is also .error
        cbs, self._callbacks = self._callbacks, []
        for fn in cbs:
            fn(self)

    def done(self) -> bool:
        """Whether the watch ended (or was cancelled)."""
        return self._fut.done()

    @property
    def reason(self) -> Reason | None:
        """How the grant ended, as lockd said; None until then, or when the
        watch ended otherwise (:attr:`error`)."""
        f = self._fut
        if f.done() and not f.cancelled() and f.exception() is None:
            return f.result()
        return None

    @property
    def error(self) -> BaseException | None:
        """Why the watch ended without lockd's reason (see the class doc);
        None otherwise."""
        return self._error

    async def wait(self) -> Reason:
        """Wait for the end of the grant and return its reason, or raise
        what ended the watch (cancelling the wait leaves the watch
        running)."""
        return await asyncio.shield(self._fut)

    def __await__(self) -> Generator[object, None, Reason]:
        return self.wait().__await__()

    def __aiter__(self) -> AsyncIterator[Reason]:
        return self._once()

    async def _once(self) -> AsyncIterator[Reason]:
        yield await self.wait()

    def add_done_callback(self, fn: Callable[[Watch], None]) -> None:
        """Call ``fn(watch)`` on the event loop when the watch ends (at once
        if it has)."""
        if self._fut.done():
            fn(self)
        else:
            self._callbacks.append(fn)

    def cancel(self) -> None:
        """Stop following the grant: :meth:`wait` raises
        :class:`asyncio.CancelledError` and nothing more is called. (lockd
        keeps the registration until the grant ends or the connection
        closes; it counts toward the connection's bound of watches until
        then.)"""
        self._w.stop()
        if not self._fut.done():
            self._fut.cancel()
            cbs, self._callbacks = self._callbacks, []
            for fn in cbs:
                fn(self)

    def __repr__(self) -> str:
        return f"lockd.Watch(key={self.key!r}, token={self.token}, reason={self.reason!r}, error={self._error!r})"
