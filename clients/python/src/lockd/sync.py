"""The synchronous facade: :class:`SyncClient`, for code without an event loop.

A :class:`SyncClient` runs the asyncio :class:`~lockd.Client` on an event loop
of its own, in a background thread ("lockd-client"), and every method hands
its call to that loop and waits for the result, so it keeps exactly the same
rules (PROTOCOL.md §7). It is safe for use from any number of threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from types import TracebackType
from typing import Any, Callable, Coroutine, TypeVar

from . import errors
from .client import Client, HeldLock, Lock, _check_key

__all__ = ["SyncClient", "SyncHeldLock", "SyncLockContext"]

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
    :class:`lockd.Client` (a possibly sent acquire closes its connection and a
    late grant is released).
    """

    def __init__(self, addrs: list[str] | tuple[str, ...], **options: Any) -> None:
        self._client = Client(addrs, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="lockd-client", daemon=True)
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread.start()
        self._call(self._client.connect())

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
        held = self._call(
            self._client.keep_alive(
                lock, lease=lease, every=every, retry=retry, margin=margin, on_renew_error=on_renew_error
            )
        )
        return SyncHeldLock(self, held)

    def lock(self, key: str, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0) -> SyncLockContext:
        """A context manager that holds ``key`` for its block::

            with c.lock("orders/42", wait=5, lease=30) as lock:
                store.write(order, token=lock.token)

        Entry acquires and starts renewing the lease in the background; exit
        stops the renewals and releases. A thread cannot be interrupted, so
        when the lock is lost the block is not stopped: ``lock.lost`` (a
        :class:`threading.Event`) is set, :meth:`SyncHeldLock.check` raises
        :class:`LockLost`, and the exit raises it if the block itself did not
        raise. Check before each action on the protected resource, and pass
        ``lock.token`` to it.
        """
        _check_key(key)
        return SyncLockContext(self, key, wait, lease, margin)

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


async def _value(fn: Callable[[], T]) -> T:
    return fn()


class SyncHeldLock:
    """A lock renewed in the background, from :meth:`SyncClient.keep_alive` or
    :meth:`SyncClient.lock`. It mirrors :class:`lockd.HeldLock`; ``lost`` is a
    :class:`threading.Event`."""

    def __init__(self, sc: SyncClient, held: HeldLock) -> None:
        self._sc = sc
        self._held = held
        self.lost = threading.Event()
        """Set (from the loop thread) when the lock is lost."""
        sc._loop.call_soon_threadsafe(held.add_lost_callback, lambda _err: self.lost.set())

    def __repr__(self) -> str:
        return f"lockd.SyncHeldLock(key={self.key!r}, token={self.token}, lost={self.lost.is_set()})"

    @property
    def lock(self) -> Lock:
        """The lock, with the ``expires`` of its latest renewal."""
        return self._held.lock

    @property
    def key(self) -> str:
        """The key."""
        return self._held.key

    @property
    def token(self) -> int:
        """The fencing token: pass it to the protected resource."""
        return self._held.token

    @property
    def expires(self) -> float:
        """The conservative end of the lease (:func:`time.monotonic`)."""
        return self._held.expires

    @property
    def stop_by(self) -> float:
        """When the holder must have stopped unless a renewal moves it."""
        return self._held.stop_by

    @property
    def error(self) -> errors.LockLost | None:
        """None while the lock is not lost; then why."""
        return self._held.error

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock is lost."""
        if self.lost.is_set() or self._held.error is not None:
            err = self._held.error
            raise err if err is not None else errors.LockLost("lockd: lock lost")

    def stop(self) -> errors.LockLost | None:
        """End the renewals and return :attr:`error`; it does not release."""
        return self._sc._call(self._held.stop())


class SyncLockContext:
    """What :meth:`SyncClient.lock` returns: ``with`` it to hold a lock for a block."""

    def __init__(self, sc: SyncClient, key: str, wait: float, lease: float | None, margin: float) -> None:
        self._sc = sc
        self._key = key
        self._wait = wait
        self._lease = lease
        self._margin = margin
        self._held: SyncHeldLock | None = None

    def __enter__(self) -> SyncHeldLock:
        sc = self._sc
        lock = sc.acquire(self._key, self._wait, self._lease)
        try:
            held = sc.keep_alive(lock, lease=self._lease, margin=self._margin)
        except BaseException:
            try:
                sc.release(lock)
            except errors.LockdError:
                pass
            raise
        self._held = held
        return held

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        held = self._held
        assert held is not None
        lost = held.stop()
        rerr: BaseException | None = None
        try:
            self._sc.release(held.lock)
        except errors.LockdError as e:
            rerr = e
        if et is not None:
            return
        if lost is not None:
            raise lost
        if isinstance(rerr, errors.NotHeld):
            raise errors.LockLost("lockd: lock lost: the release was answered N (not held)", rerr)
        if rerr is not None:
            raise rerr
