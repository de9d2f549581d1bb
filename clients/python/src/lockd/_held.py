"""Held locks: the background renewal and watch (:class:`Renewer`), the view
both held-lock types share (:class:`HeldBase`), the asyncio :class:`HeldLock`
and :class:`LockContext`, and the entry and exit of a ``lock()`` block that
:mod:`lockd.sync` runs too (:func:`begin_hold`, :func:`end_hold`)."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Callable

from . import errors
from ._ops import Core
from ._types import Lock, check_key, check_limit
from ._watch import Watcher

__all__ = ["HeldLock", "LockContext", "Semaphore", "RWLock", "READERS"]

log = logging.getLogger("lockd")


class Renewer:
    """Renews one lock in the background, on the client's loop, until it is
    stopped or the lock is lost; and watches it (PROTOCOL.md §9.4), so that
    the lock is lost the moment lockd pushes ``L`` for it, not at the next
    renewal.

    The watch (a :class:`~lockd._watch.Watcher`, started with the renewals
    unless the client's ``watch_locks`` is off) follows the grant: an ``L``
    with reason 1–3 (released, expired, forced) loses the lock at once.
    When a registration lapses — an ``L`` 4, the member can no longer tell;
    its connection lost — the lock renews at once (the renewal reaches the
    member that serves now and confirms or denies the grant) and the watch
    registers again there; a registration answered ``N`` loses the lock.
    A watch that every connection refuses (``E`` 8) is tried again a
    renewal interval later; one that cannot be had at all (a server without
    §9, no permission) leaves the lock to its renewals, said once at
    WARNING.
    """

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
        self.stopped = False
        self.watcher: Watcher | None = None
        self.wake = asyncio.Event()  # renew now: the watch lapsed

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
        """The lock is lost: record why, end the renewals and the watch, and
        tell the callbacks."""
        if self.error is not None:
            return
        level = logging.INFO if isinstance(err.reason, errors.Closed) else logging.WARNING
        log.log(level, "lockd: lock %r (token %d) lost: %s", self.lock.key, self.lock.token, err)
        self.error = err
        self._unwatch()
        t = self.task
        if t is not None and not t.done() and t is not asyncio.current_task():
            t.cancel()  # lost from outside the renewals (an L): they end now
        cbs, self.callbacks = self.callbacks, []
        for fn in cbs:
            fn(err)

    async def stop(self) -> errors.LockLost | None:
        """End the renewals (one in flight is abandoned) and the watch;
        return the error."""
        self.stopped = True
        self._unwatch()
        t = self.task
        if t is not None and not t.done():
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                if not t.cancelled():
                    raise
        return self.error

    # The watch.

    def watch(self) -> None:
        """Start watching the lock in the background."""
        core = self.core
        if not core.st.watch_locks or self.error is not None or self.stopped or core.closed:
            return
        w = Watcher(core, self.lock.key, self.lock.token, self._watch_ended, self._lapsed, limit_retry=self.every)
        self.watcher = w
        w.start(None)

    def _unwatch(self) -> None:
        w, self.watcher = self.watcher, None
        if w is not None:
            w.stop()

    def _lapsed(self, reason: int, err: BaseException | None) -> None:
        """A registration lapsed (L 4, or its connection ended): renew now."""
        why = f"its connection ended ({err})" if err is not None else f"the member can no longer tell (L {reason})"
        log.info(
            "lockd: the watch of %r (token %d) lapsed: %s; renewing and watching it again",
            self.lock.key,
            self.lock.token,
            why,
        )
        self.wake.set()

    def _watch_ended(self, result: errors.GrantEnded | BaseException) -> None:
        self.watcher = None
        core = self.core
        if self.error is not None or self.stopped or core.closed or isinstance(result, errors.Closed):
            return
        if isinstance(result, errors.NotHeld):
            if isinstance(result, errors.GrantEnded):
                self.lose(errors.LockLost(f"lockd: lock lost: {result}", result))
            else:
                self.lose(errors.LockLost("lockd: lock lost: a watch of it was answered N (not held)", result))
            return
        # Once in a row at WARNING: with many locks, one line says it.
        log.log(
            logging.DEBUG if core.unwatched else logging.WARNING,
            "lockd: %r (token %d) is not watched (%s): its loss is noticed by its renewals",
            self.lock.key,
            self.lock.token,
            result,
        )
        core.unwatched = True

    async def _pause(self, d: float) -> bool:
        """Sleep ``d``, or until :attr:`wake` is set; False if the client
        closed."""
        core = self.core
        if not self.wake.is_set() and d > 0:
            closing = core.pool.closing
            waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(closing.wait())]
            try:
                await asyncio.wait(waits, timeout=d, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in waits:
                    t.cancel()
        self.wake.clear()
        return not core.closed

    def _next_renewal(self) -> float:
        left = self.stop_by - self.core.loop.time()
        return max(0.0, min(self.every, left / 2))

    async def run(self) -> None:
        """The renewal loop."""
        core = self.core
        loop = core.loop
        key, token = self.lock.key, self.lock.token
        delay = self._next_renewal()
        failures = 0
        err: BaseException | None = None
        while True:
            by = self.stop_by
            at = min(loop.time() + delay, by)
            if core.closed or not await self._pause(at - loop.time()):
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
    r.watch()
    return r


async def _release_quietly(core: Core, lock: Lock) -> None:
    try:
        await core.release(lock)
    except errors.LockdError as e:
        log.warning("lockd: releasing %r (token %d) failed, its lease will end it: %s", lock.key, lock.token, e)


async def begin_hold(core: Core, key: str, wait: float, lease: float | None, margin: float, limit: int = 0) -> Renewer:
    """The entry of a ``lock()`` block (with a ``limit``: a semaphore's
    permit, a reader): acquire, then keep alive and watch (a lock that cannot
    be kept alive is released again)."""
    lock = await core.acquire(key, wait, lease, limit)
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
    :class:`LockLost`, whose ``reason`` is the :class:`GrantEnded` of
    lockd's ``L`` — its ``ended`` says released, expired or forced —, a
    :class:`NotHeld`, :class:`Closed`, or None for a stop time that passed).
    A holder must stop touching the protected resource by :attr:`stop_by`,
    and pass :attr:`token` to it. A :class:`HeldLock` never releases the
    lock: :meth:`stop` it, then release.
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
        """End the renewals (one in flight is abandoned) and the watch, and
        return :attr:`error`. It does not release the lock."""
        return await self._r.stop()


class LockContext:
    """What :meth:`Client.lock` returns — and :meth:`RWLock.read`,
    :meth:`RWLock.write`, :meth:`Semaphore.acquire` —: ``async with`` it to
    hold a lock for a block (see :meth:`Client.lock`). One use."""

    def __init__(
        self, start: Callable[[], Core], key: str, wait: float, lease: float | None, margin: float, limit: int = 0
    ) -> None:
        self._start = start  # the client's core, started on the running loop
        self._core: Core | None = None
        self._key = key
        self._wait = wait
        self._lease = lease
        self._margin = margin
        self._limit = limit
        self._r: Renewer | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._cancelled = False
        self._exiting = False

    async def __aenter__(self) -> HeldLock:
        self._core = self._start()
        r = await begin_hold(self._core, self._key, self._wait, self._lease, self._margin, self._limit)
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


READERS = 65535
"""The limit a read/write lock's readers give (PROTOCOL.md §9.2): the
largest, so that readers never wait for one another."""


class Options:
    """The wait, lease and margin a semaphore or read/write lock gives each
    of its acquires, unless the acquire gives its own."""

    def __init__(self, key: str, wait: float, lease: float | None, margin: float) -> None:
        check_key(key)
        self.key = key
        self.wait = wait
        self.lease = lease
        self.margin = margin

    def pick(
        self, wait: float | None, lease: float | None, margin: float | None
    ) -> tuple[float, float | None, float]:
        """The options of one acquire."""
        return (
            self.wait if wait is None else wait,
            self.lease if lease is None else lease,
            self.margin if margin is None else margin,
        )


class Semaphore:
    """A counted lock: at most ``limit`` holders of ``key`` at once, across
    every process (PROTOCOL.md §9.2: ``S`` with ``limit``), from
    :meth:`Client.semaphore`. Each ``async with`` holds one permit for its
    block, exactly as :meth:`Client.lock` holds a lock (renewed, watched,
    released at the end; the block is cancelled with :class:`LockLost` if
    the permit is lost)::

        sem = c.semaphore("workers", 4, wait=30)
        async with sem as permit:          # one of 4
            await work(token=permit.token)

    One object may be shared by any number of tasks (each ``async with`` is
    its own permit); :meth:`acquire` takes other options for one permit.
    Every holder of the key must give the same limit (else
    :class:`LimitMismatch`). Waiters are served in FIFO order.
    """

    def __init__(
        self, start: Callable[[], Core], key: str, limit: int, wait: float, lease: float | None, margin: float
    ) -> None:
        check_limit(limit)
        self._start = start
        self._o = Options(key, wait, lease, margin)
        self._limit = limit
        self._held: dict[asyncio.Task[object], list[LockContext]] = {}

    @property
    def key(self) -> str:
        """The semaphore's key."""
        return self._o.key

    @property
    def limit(self) -> int:
        """How many permits the key has."""
        return self._limit

    def acquire(self, *, wait: float | None = None, lease: float | None = None, margin: float | None = None) -> LockContext:
        """A context for one permit, with these options instead of the
        semaphore's: ``async with sem.acquire(wait=1) as permit:``."""
        w, ls, m = self._o.pick(wait, lease, margin)
        return LockContext(self._start, self._o.key, w, ls, m, self._limit)

    async def __aenter__(self) -> HeldLock:
        ctx = self.acquire()
        held = await ctx.__aenter__()
        task = asyncio.current_task()
        assert task is not None
        self._held.setdefault(task, []).append(ctx)
        return held

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        stack = self._held[task]
        ctx = stack.pop()
        if not stack:
            del self._held[task]
        await ctx.__aexit__(et, ev, tb)

    def __repr__(self) -> str:
        return f"lockd.Semaphore(key={self.key!r}, limit={self._limit})"


class RWLock:
    """A read/write lock on ``key`` across every process (PROTOCOL.md
    §9.2), from :meth:`Client.rw_lock`: any number of readers at once
    (:meth:`read`: ``S`` with limit 65535), or one writer alone
    (:meth:`write`: ``A``)::

        rw = c.rw_lock("config", wait=10)
        async with rw.read() as lock:       # shared with other readers
            cfg = await load(token=lock.token)
        async with rw.write() as lock:      # alone
            await save(cfg, token=lock.token)

    Each context is held like :meth:`Client.lock`'s (renewed, watched,
    released at the end). The queue is FIFO without overtaking: a writer
    waiting at its head holds up every reader behind it, so readers cannot
    starve a writer; a writer's token is larger than every earlier
    reader's.
    """

    def __init__(self, start: Callable[[], Core], key: str, wait: float, lease: float | None, margin: float) -> None:
        self._start = start
        self._o = Options(key, wait, lease, margin)

    @property
    def key(self) -> str:
        """The lock's key."""
        return self._o.key

    def read(self, *, wait: float | None = None, lease: float | None = None, margin: float | None = None) -> LockContext:
        """A context that holds the lock shared, with other readers
        (options default to the lock's)."""
        w, ls, m = self._o.pick(wait, lease, margin)
        return LockContext(self._start, self._o.key, w, ls, m, READERS)

    def write(self, *, wait: float | None = None, lease: float | None = None, margin: float | None = None) -> LockContext:
        """A context that holds the lock alone (options default to the
        lock's)."""
        w, ls, m = self._o.pick(wait, lease, margin)
        return LockContext(self._start, self._o.key, w, ls, m)

    def __repr__(self) -> str:
        return f"lockd.RWLock(key={self.key!r})"
