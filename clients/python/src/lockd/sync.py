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
from typing import Any, Callable, Coroutine, TypeVar

from . import errors
from ._held import HeldBase, Renewer, begin_hold, end_hold, keep_alive
from ._ops import Core
from ._types import Lock, check_key
from .client import Client

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
        self._held = sc._held(begin_hold(sc._core, self._key, self._wait, self._lease, self._margin))
        return self._held

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        held = self._held
        assert held is not None
        err = self._sc._call(end_hold(self._sc._core, held._r))
        if et is not None:
            return
        if err is not None:
            raise err
