"""Held locks: the background renewal (:class:`Renewer`), the view both
held-lock types share (:class:`HeldBase`), the asyncio :class:`HeldLock` and
:class:`LockContext`, and the entry and exit of a ``lock()`` block that
:mod:`lockd.sync` runs too (:func:`begin_hold`, :func:`end_hold`)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Callable

from . import errors
from ._ops import Core
from ._types import Lock, check_key

__all__ = ["HeldLock", "LockContext"]

log = logging.getLogger("lockd")


class Renewer:
    """Renews one lock in the background, on the client's loop, until it is
    stopped or the lock is lost."""

    def __init__(
        self,
        core: Core,
        lock: Lock,
        lease: int,
        every: float,
        retry: float,
        margin: float,
        on_renew_error: Callable[[BaseException], None] | None,
    ) -> None:
        self.core = core
        self.lock = lock
        self.lease = lease
        self.every = every
        self.retry = retry
        self.margin = margin
        self.on_renew_error = on_renew_error
        self.task: asyncio.Task[None] | None = None
        self.callbacks: list[Callable[[errors.LockLost], None]] = []
        self.error: errors.LockLost | None = None

    @property
    def stop_by(self) -> float:
        """``expires - margin`` of the latest renewal."""
        return self.lock.expires - self.margin

    def add_lost_callback(self, fn: Callable[[errors.LockLost], None]) -> None:
        """Call ``fn(error)`` when the lock is lost (at once if it is)."""
        if self.error is not None:
            fn(self.error)
            return
        self.callbacks.append(fn)

    def lose(self, err: errors.LockLost) -> None:
        """The lock is lost: record why and tell the callbacks."""
        if self.error is not None:
            return
        level = logging.INFO if isinstance(err.reason, errors.Closed) else logging.WARNING
        log.log(level, "lockd: lock %r (token %d) lost: %s", self.lock.key, self.lock.token, err)
        self.error = err
        cbs, self.callbacks = self.callbacks, []
        for fn in cbs:
            fn(err)

    async def stop(self) -> errors.LockLost | None:
        """End the renewals (one in flight is abandoned); return the error."""
        t = self.task
        if t is not None and not t.done():
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                if not t.cancelled():
                    raise
        return self.error

    def _next_renewal(self) -> float:
        left = self.stop_by - self.core.loop.time()
        return max(0.0, min(self.every, left / 2))

    async def run(self) -> None:
        """The renewal loop."""
        core = self.core
        pool = core.pool
        loop = core.loop
        key, token = self.lock.key, self.lock.token
        delay = self._next_renewal()
        failures = 0
        err: BaseException | None = None
        while True:
            by = self.stop_by
            at = min(loop.time() + delay, by)
            if core.closed or not await pool.sleep(at - loop.time(), by + 1):
                self.lose(errors.LockLost("lockd: lock lost: the client was closed", errors.Closed("lockd: client closed")))
                return
            if loop.time() >= by:
                self.lose(
                    errors.LockLost("lockd: lock lost: no renewal succeeded before the holder's stop time", None, err)
                )
                return
            try:
                async with asyncio.timeout_at(by):
                    nl = await core.renew(self.lock, self.lease)
            except errors.NotHeld as e:
                self.lose(errors.LockLost("lockd: lock lost: a renewal was answered N (not held)", e))
                return
            except errors.Closed as e:
                self.lose(errors.LockLost("lockd: lock lost: the client was closed", e))
                return
            except (errors.LockdError, TimeoutError) as e:
                err = e
            else:
                self.lock = nl
                if failures:
                    log.info("lockd: renewed %r (token %d) after %d failed attempts", key, token, failures)
                else:
                    log.debug("lockd: renewed %r (token %d) for %d s", key, token, self.lease)
                failures = 0
                err = None
                delay = self._next_renewal()
                continue
            failures += 1
            if loop.time() >= by:
                why = (
                    "the last renewal was still unanswered"
                    if isinstance(err, TimeoutError) and not isinstance(err, errors.LockdError)
                    else f"last error: {err}"
                )
                self.lose(
                    errors.LockLost(f"lockd: lock lost: no renewal succeeded before the holder's stop time ({why})", None, err)
                )
                return
            delay = min(self.retry, by - loop.time())
            log.log(
                logging.WARNING if failures == 1 else logging.DEBUG,
                "lockd: renewing %r (token %d) failed: %s; retrying every %.2f s until its stop time in %.2f s",
                key,
                token,
                err,
                delay,
                by - loop.time(),
            )
            if self.on_renew_error is not None:
                self.on_renew_error(err)


async def keep_alive(
    core: Core,
    lock: Lock,
    lease: float | None,
    every: float | None,
    retry: float | None,
    margin: float,
    on_renew_error: Callable[[BaseException], None] | None,
) -> Renewer:
    """Start renewing ``lock`` (see :meth:`lockd.Client.keep_alive`)."""
    check_key(lock.key)
    ls = core.lease(lease, lock)
    if every is None:
        every = ls / 3
    if retry is None:
        retry = core.st.retry_pause
    if not every > 0 or not retry > 0 or not 0 <= margin < ls:
        raise errors.InvalidArgument("lockd: every and retry must be positive, and margin in [0, lease)")
    if lock.expires - margin - core.loop.time() < 2 * every:
        try:
            lock = await core.renew(lock, ls)
        except errors.NotHeld as e:
            raise errors.LockLost("lockd: lock lost: a renewal was answered N (not held)", e) from e
    r = Renewer(core, lock, ls, every, retry, margin, on_renew_error)
    r.task = core.spawn(r.run())
    return r


async def _release_quietly(core: Core, lock: Lock) -> None:
    try:
        await core.release(lock)
    except errors.LockdError as e:
        log.warning("lockd: releasing %r (token %d) failed, its lease will end it: %s", lock.key, lock.token, e)


async def begin_hold(core: Core, key: str, wait: float, lease: float | None, margin: float) -> Renewer:
    """The entry of a ``lock()`` block: acquire, then keep alive (a lock
    that cannot be kept alive is released again)."""
    lock = await core.acquire(key, wait, lease)
    try:
        return await keep_alive(core, lock, lease, None, None, margin, None)
    except BaseException:
        await asyncio.shield(core.spawn(_release_quietly(core, lock)))
        raise


async def end_hold(core: Core, r: Renewer) -> errors.LockdError | None:
    """The exit of a ``lock()`` block: stop the renewals and release; return
    what the exit raises unless the block raised (None: nothing).

    A lost lock is reported at once: a release (when one can still help: the
    lock was not answered ``N`` and the client is open) runs in the
    background, since the server may be unreachable for all its retries."""
    lost = await r.stop()
    if lost is not None:
        if not core.closed and not isinstance(lost.reason, (errors.NotHeld, errors.Closed)):
            core.spawn(_release_quietly(core, r.lock))
        return lost
    if core.closed:
        return None
    try:
        await asyncio.shield(core.spawn(core.release(r.lock)))
    except errors.NotHeld as e:
        return errors.LockLost("lockd: lock lost: the release was answered N (not held)", e)
    except errors.LockdError as e:
        return e
    return None


class HeldBase:
    """What :class:`HeldLock` and :class:`lockd.SyncHeldLock` share: the
    view of a lock renewed in the background."""

    _r: Renewer

    @property
    def lock(self) -> Lock:
        """The lock, with the ``expires`` of its latest renewal."""
        return self._r.lock

    @property
    def key(self) -> str:
        """The key."""
        return self._r.lock.key

    @property
    def token(self) -> int:
        """The fencing token: pass it to the protected resource."""
        return self._r.lock.token

    @property
    def lease(self) -> int:
        """The lease each renewal asks for, in seconds."""
        return self._r.lease

    @property
    def expires(self) -> float:
        """The conservative end of the lease after the latest renewal (loop
        clock: :func:`time.monotonic` for asyncio's default loop and for
        :class:`lockd.SyncClient`)."""
        return self._r.lock.expires

    @property
    def stop_by(self) -> float:
        """When the holder must have stopped unless a renewal moves it:
        ``expires - margin``."""
        return self._r.stop_by

    @property
    def error(self) -> errors.LockLost | None:
        """None while the lock is not lost; then why (see
        :class:`lockd.LockLost`'s ``reason``)."""
        return self._r.error

    def __repr__(self) -> str:
        return f"lockd.{type(self).__name__}(key={self.key!r}, token={self.token}, lost={self.error is not None})"


class HeldLock(HeldBase):
    """A lock renewed in the background (from :meth:`Client.keep_alive` or
    :meth:`Client.lock`).

    ``lost`` is set when the lock is lost; ``error`` then says why (a
    :class:`LockLost`, whose ``reason`` is :class:`NotHeld`, :class:`Closed`
    or None for a stop time that passed). A holder must stop touching the
    protected resource by :attr:`stop_by`, and pass :attr:`token` to it.
    A :class:`HeldLock` never releases the lock: :meth:`stop` it, then
    release.
    """

    def __init__(self, r: Renewer) -> None:
        self._r = r
        self.lost = asyncio.Event()
        """Set when the lock is lost."""
        r.add_lost_callback(lambda _err: self.lost.set())

    def add_lost_callback(self, fn: Callable[[errors.LockLost], None]) -> None:
        """Call ``fn(error)`` on the event loop when the lock is lost (at once
        if it is lost already)."""
        self._r.add_lost_callback(fn)

    async def stop(self) -> errors.LockLost | None:
        """End the renewals (one in flight is abandoned) and return
        :attr:`error`. It does not release the lock."""
        return await self._r.stop()


class LockContext:
    """What :meth:`Client.lock` returns: ``async with`` it to hold a lock for
    a block (see there)."""

    def __init__(self, start: Callable[[], Core], key: str, wait: float, lease: float | None, margin: float) -> None:
        self._start = start  # the client's core, started on the running loop
        self._core: Core | None = None
        self._key = key
        self._wait = wait
        self._lease = lease
        self._margin = margin
        self._r: Renewer | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._cancelled = False
        self._exiting = False

    async def __aenter__(self) -> HeldLock:
        self._core = self._start()
        r = await begin_hold(self._core, self._key, self._wait, self._lease, self._margin)
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._r = r
        held = HeldLock(r)
        r.add_lost_callback(self._on_lost)
        return held

    def _on_lost(self, err: errors.LockLost) -> None:
        # The block's task is suspended at an await of the block (it runs
        # nowhere else while this callback runs, and __aexit__ sets _exiting
        # before its first await), so the cancellation lands in the block.
        if self._exiting or self._task is None or self._task.done():
            return
        self._cancelled = True
        self._task.cancel(msg=str(err))

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exiting = True
        r = self._r
        assert r is not None and self._task is not None and self._core is not None
        converted = False
        if self._cancelled:
            if self._task.uncancel() <= self._cancelling and et is asyncio.CancelledError:
                converted = True
        err = await end_hold(self._core, r)
        if converted:
            assert r.error is not None
            raise r.error from ev
        if et is not None:
            return
        if err is not None:
            raise err
