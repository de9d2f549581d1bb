"""The synchronous facade: :class:`SyncClient`, for code without an event loop.

A :class:`SyncClient` runs the asyncio :class:`~lockd.Client` on an event loop
of its own, in a background thread ("lockd-client"), and every method hands
its call to that loop and waits for the result, so it keeps exactly the same
rules (PROTOCOL.md §7). It is safe for use from any number of threads. Its
held locks share their code with the asyncio ones (``lockd._held``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import ssl as _ssl
import threading
from types import TracebackType
from typing import Any, Callable, Coroutine, Iterator, TypeVar, overload

from . import errors
from ._held import READERS, HeldBase, Options, Renewer, begin_hold, end_hold, keep_alive
from ._ops import Core
from ._types import Grant, Inspection, Lock, check_key, check_limit, grant_of
from ._watch import Watch
from .client import Client
from .errors import Reason

__all__ = ["SyncClient", "SyncHeldLock", "SyncLockContext", "SyncWatch", "SyncSemaphore", "SyncRWLock"]

T = TypeVar("T")


class SyncClient:
    """A blocking lockd client; takes the same arguments as :class:`lockd.Client`.

    ::

        with lockd.SyncClient(["127.0.0.1:7070"]) as c:
            with c.lock("reports/nightly", wait=10, lease=30) as lock:
                write_report(token=lock.token)

    The connections live on a background event loop started here; :meth:`close`
    (or leaving the ``with``) stops it. ``Lock.expires`` values are
    :func:`time.monotonic` readings. A call interrupted in the calling thread
    (``KeyboardInterrupt``) is cancelled on the loop under the rules of
    :class:`lockd.Client` (the connection stays, a late grant is released).
    """

    def __init__(
        self,
        addrs: list[str] | tuple[str, ...],
        *,
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        identity: str | None = None,
        secret: str | bytes | None = None,
        secret_file: str | os.PathLike[str] | None = None,
        conns_per_addr: int = 0,
        dial_timeout: float = 5.0,
        reconnect_interval: float = 3.0,
        transport_timeout: float = 5.0,
        answer_allowance: float = 1.0,
        release_retry: float = 5.0,
        release_retry_interval: float = 0.2,
        retry_pause: float = 0.1,
        default_lease: float = 30.0,
        fail_fast: bool = False,
        watch_locks: bool = True,
    ) -> None:
        self._client = Client(
            addrs,
            ssl=ssl,
            server_hostname=server_hostname,
            identity=identity,
            secret=secret,
            secret_file=secret_file,
            conns_per_addr=conns_per_addr,
            dial_timeout=dial_timeout,
            reconnect_interval=reconnect_interval,
            transport_timeout=transport_timeout,
            answer_allowance=answer_allowance,
            release_retry=release_retry,
            release_retry_interval=release_retry_interval,
            retry_pause=retry_pause,
            default_lease=default_lease,
            fail_fast=fail_fast,
            watch_locks=watch_locks,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="lockd-client", daemon=True)
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread.start()
        self._core: Core = self._call(_start(self._client))

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("lockd: a SyncClient method was called from its own event loop thread")
        if self._loop.is_closed():
            coro.close()
            raise errors.Closed("lockd: client closed")
        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return "lockd.Sync" + repr(self._client)[len("lockd.") :]

    @property
    def client(self) -> Client:
        """The asyncio client underneath (use it only on :attr:`loop`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The background event loop."""
        return self._loop

    @property
    def identity(self) -> str:
        """The identity a server last confirmed with ``H`` ("" if none yet)."""
        return self._call(_value(lambda: self._client.identity))

    def live_connections(self) -> int:
        """How many connections are up now."""
        return self._call(_value(self._client.live_connections))

    def acquire(self, key: str, wait: float = 0.0, lease: float | None = None) -> Lock:
        """Take the lock on ``key``; see :meth:`lockd.Client.acquire`."""
        return self._call(self._client.acquire(key, wait, lease))

    def release(self, lock: Lock) -> None:
        """Release ``lock``; see :meth:`lockd.Client.release`."""
        self._call(self._client.release(lock))

    def renew(self, lock: Lock, lease: float | None = None) -> Lock:
        """Renew ``lock``'s lease; see :meth:`lockd.Client.renew`."""
        return self._call(self._client.renew(lock, lease))

    def ping(self) -> float:
        """Measure a round trip in seconds; see :meth:`lockd.Client.ping`."""
        return self._call(self._client.ping())

    def acquire_shared(self, key: str, limit: int, wait: float = 0.0, lease: float | None = None) -> Lock:
        """Take one of ``limit`` shared holds of ``key``; see
        :meth:`lockd.Client.acquire_shared`."""
        return self._call(self._client.acquire_shared(key, limit, wait, lease))

    @overload
    def validate(self, grant: Grant, /) -> float: ...

    @overload
    def validate(self, key: str, token: int, /) -> float: ...

    def validate(self, key: Grant | str, token: int | None = None, /) -> float:
        """The lease time left of a current holder, in seconds, or
        :class:`NotHeld`; see :meth:`lockd.Client.validate`."""
        k, t = grant_of(key, token)
        return self._call(self._client.validate(k, t))

    @overload
    def watch(self, grant: Grant, /) -> SyncWatch: ...

    @overload
    def watch(self, key: str, token: int, /) -> SyncWatch: ...

    def watch(self, key: Grant | str, token: int | None = None, /) -> SyncWatch:
        """Watch a grant; see :meth:`lockd.Client.watch`. Returns a
        :class:`SyncWatch` once lockd registered it."""

        async def start() -> SyncWatch:
            w = await self._client.watch(k, t)
            return SyncWatch(self, w)

        k, t = grant_of(key, token)

        return self._call(start())

    def inspect(self, key: str) -> Inspection:
        """A key's state now; see :meth:`lockd.Client.inspect`."""
        return self._call(self._client.inspect(key))

    def keep_alive(
        self,
        lock: Lock,
        *,
        lease: float | None = None,
        every: float | None = None,
        retry: float | None = None,
        margin: float = 0.0,
        on_renew_error: Callable[[BaseException], None] | None = None,
    ) -> SyncHeldLock:
        """Renew ``lock`` in the background; see :meth:`lockd.Client.keep_alive`.

        ``on_renew_error`` runs on the client's loop thread and must not block.
        """
        check_key(lock.key)
        return self._held(keep_alive(self._core, lock, lease, every, retry, margin, on_renew_error))

    def _held(self, start: Coroutine[Any, Any, Renewer]) -> SyncHeldLock:
        """Run ``start`` on the loop and wrap its renewer, its loss watched
        from the moment it starts."""

        async def wrapped() -> SyncHeldLock:
            return SyncHeldLock(self, await start)

        try:
            return self._call(wrapped())
        finally:
            start.close()  # a no-op once it ran; if it never did, no "never awaited" warning

    def lock(self, key: str, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0) -> SyncLockContext:
        """A context manager that holds ``key`` for its block::

            with c.lock("orders/42", wait=5, lease=30) as lock:
                store.write(order, token=lock.token)

        Entry acquires and starts renewing the lease in the background; exit
        stops the renewals and releases. A thread cannot be interrupted, so
        when the lock is lost the block is not stopped: ``lock.lost`` (a
        :class:`threading.Event`) is set, :meth:`SyncHeldLock.check` raises
        :class:`LockLost`, and the exit raises it at once if the block itself
        did not raise (a release that may still help runs in the background).
        Check before each action on the protected resource, and pass
        ``lock.token`` to it.
        """
        check_key(key)
        return SyncLockContext(self, key, wait, lease, margin)

    def semaphore(
        self, key: str, limit: int, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0
    ) -> SyncSemaphore:
        """A semaphore of ``limit`` permits on ``key``: ``with`` it to hold
        one permit for a block, as :meth:`lock` holds a lock::

            with c.semaphore("workers", 4, wait=30) as permit:
                work(token=permit.token)

        See :meth:`lockd.Client.semaphore` and :class:`SyncSemaphore`.
        """
        return SyncSemaphore(self, key, limit, wait, lease, margin)

    def rw_lock(self, key: str, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0) -> SyncRWLock:
        """A read/write lock on ``key``: ``with rw.read()`` shared with other
        readers, ``with rw.write()`` alone; see :meth:`lockd.Client.rw_lock`."""
        return SyncRWLock(self, key, wait, lease, margin)

    def close(self) -> None:
        """Close the client (see :meth:`lockd.Client.close`) and stop its loop
        and thread. Calling it again does nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._call(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


async def _start(c: Client) -> Core:
    return c._started()


async def _value(fn: Callable[[], T]) -> T:
    return fn()


class SyncHeldLock(HeldBase):
    """A lock renewed in the background, from :meth:`SyncClient.keep_alive` or
    :meth:`SyncClient.lock`. It has the properties of :class:`lockd.HeldLock`
    (``lock``, ``key``, ``token``, ``lease``, ``expires``, ``stop_by``,
    ``error``); ``lost`` is a :class:`threading.Event`. Made on the loop."""

    def __init__(self, sc: SyncClient, r: Renewer) -> None:
        self._sc = sc
        self._r = r
        self.lost = threading.Event()
        """Set (from the loop thread) when the lock is lost."""
        r.add_lost_callback(lambda _err: self.lost.set())

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock is lost."""
        err = self._r.error
        if err is not None:
            raise err

    def stop(self) -> errors.LockLost | None:
        """End the renewals and return :attr:`error`; it does not release."""
        return self._sc._call(self._r.stop())


class SyncLockContext:
    """What :meth:`SyncClient.lock` returns — and :meth:`SyncRWLock.read`,
    :meth:`SyncRWLock.write`, :meth:`SyncSemaphore.acquire` —: ``with`` it to
    hold a lock for a block. One use."""

    def __init__(
        self, sc: SyncClient, key: str, wait: float, lease: float | None, margin: float, limit: int = 0
    ) -> None:
        self._sc = sc
        self._key = key
        self._wait = wait
        self._lease = lease
        self._margin = margin
        self._limit = limit
        self._held: SyncHeldLock | None = None

    def __enter__(self) -> SyncHeldLock:
        sc = self._sc
        self._held = sc._held(begin_hold(sc._core, self._key, self._wait, self._lease, self._margin, self._limit))
        return self._held

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        held = self._held
        assert held is not None
        err = self._sc._call(end_hold(self._sc._core, held._r))
        if et is not None:
            return
        if err is not None:
            raise err


class SyncWatch:
    """A registered watch (:meth:`SyncClient.watch`), as :class:`lockd.Watch`
    for threads: :meth:`wait` blocks until the grant ends and returns its
    :class:`Reason` (or raises what ended the watch otherwise); ``for reason
    in watch`` yields it once. Safe from any thread. Made on the loop."""

    def __init__(self, sc: SyncClient, w: Watch) -> None:
        self._sc = sc
        self._w = w
        self._ev = threading.Event()
        self._reason: Reason | None = None
        self._error: BaseException | None = None
        w.add_done_callback(self._ended)

    def _ended(self, w: Watch) -> None:
        self._reason = w.reason
        self._error = w.error
        self._ev.set()

    @property
    def key(self) -> str:
        """The watched grant's key."""
        return self._w.key

    @property
    def token(self) -> int:
        """The watched grant's token."""
        return self._w.token

    @property
    def reason(self) -> Reason | None:
        """How the grant ended, as lockd said; None until then, or when the
        watch ended otherwise (:attr:`error`)."""
        return self._reason if self._ev.is_set() else None

    @property
    def error(self) -> BaseException | None:
        """Why the watch ended without lockd's reason (see
        :class:`lockd.Watch`); None otherwise."""
        return self._error if self._ev.is_set() else None

    def done(self) -> bool:
        """Whether the watch ended (or was cancelled)."""
        return self._ev.is_set()

    def wait(self, timeout: float | None = None) -> Reason | None:
        """Block until the grant ends (at most ``timeout`` seconds) and
        return its reason, or raise what ended the watch otherwise
        (:class:`NotHeld`, :class:`WatchLimit`, ...); None if the timeout
        passed first, or after :meth:`cancel`."""
        self._ev.wait(timeout)
        err = self.error
        if err is not None:
            raise err
        return self.reason

    def __iter__(self) -> Iterator[Reason]:
        r = self.wait()
        if r is not None:
            yield r

    def cancel(self) -> None:
        """Stop following the grant: :meth:`wait` returns None (see
        :meth:`lockd.Watch.cancel`)."""
        try:
            self._sc._loop.call_soon_threadsafe(self._w.cancel)
        except RuntimeError:
            pass  # the client's loop is closed: nothing is called any more
        self._ev.set()

    def __repr__(self) -> str:
        return f"lockd.SyncWatch(key={self.key!r}, token={self.token}, reason={self.reason!r}, error={self.error!r})"


class SyncSemaphore:
    """A semaphore of ``limit`` permits on ``key`` (:meth:`SyncClient.semaphore`):
    each ``with`` holds one permit for its block, as :meth:`SyncClient.lock`
    holds a lock. One object may be shared by any number of threads (each
    ``with`` is its own permit); :meth:`acquire` takes other options for one
    permit. See :class:`lockd.Semaphore`."""

    def __init__(self, sc: SyncClient, key: str, limit: int, wait: float, lease: float | None, margin: float) -> None:
        check_limit(limit)
        self._sc = sc
        self._o = Options(key, wait, lease, margin)
        self._limit = limit
        self._mu = threading.Lock()
        self._held: dict[int, list[SyncLockContext]] = {}

    @property
    def key(self) -> str:
        """The semaphore's key."""
        return self._o.key

    @property
    def limit(self) -> int:
        """How many permits the key has."""
        return self._limit

    def acquire(
        self, *, wait: float | None = None, lease: float | None = None, margin: float | None = None
    ) -> SyncLockContext:
        """A context for one permit, with these options instead of the
        semaphore's: ``with sem.acquire(wait=1) as permit:``."""
        w, ls, m = self._o.pick(wait, lease, margin)
        return SyncLockContext(self._sc, self._o.key, w, ls, m, self._limit)

    def __enter__(self) -> SyncHeldLock:
        ctx = self.acquire()
        held = ctx.__enter__()
        with self._mu:
            self._held.setdefault(threading.get_ident(), []).append(ctx)
        return held

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        me = threading.get_ident()
        with self._mu:
            stack = self._held[me]
            ctx = stack.pop()
            if not stack:
                del self._held[me]
        ctx.__exit__(et, ev, tb)

    def __repr__(self) -> str:
        return f"lockd.SyncSemaphore(key={self.key!r}, limit={self._limit})"


class SyncRWLock:
    """A read/write lock on ``key`` (:meth:`SyncClient.rw_lock`): ``with
    rw.read()`` holds it shared with other readers, ``with rw.write()``
    alone. See :class:`lockd.RWLock`."""

    def __init__(self, sc: SyncClient, key: str, wait: float, lease: float | None, margin: float) -> None:
        self._sc = sc
        self._o = Options(key, wait, lease, margin)

    @property
    def key(self) -> str:
        """The lock's key."""
        return self._o.key

    def read(
        self, *, wait: float | None = None, lease: float | None = None, margin: float | None = None
    ) -> SyncLockContext:
        """A context that holds the lock shared, with other readers."""
        w, ls, m = self._o.pick(wait, lease, margin)
        return SyncLockContext(self._sc, self._o.key, w, ls, m, READERS)

    def write(
        self, *, wait: float | None = None, lease: float | None = None, margin: float | None = None
    ) -> SyncLockContext:
        """A context that holds the lock alone."""
        w, ls, m = self._o.pick(wait, lease, margin)
        return SyncLockContext(self._sc, self._o.key, w, ls, m)

    def __repr__(self) -> str:
        return f"lockd.SyncRWLock(key={self.key!r})"
