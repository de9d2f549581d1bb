"""The asyncio client: :class:`Client`, :class:`Lock`, :class:`HeldLock`,
:class:`Watch`, :class:`Inspection`, :class:`Semaphore`, :class:`RWLock`.

The client keeps every obligation of PROTOCOL.md §7 and §8.6; the docstring
of :class:`Client` says how, rule by rule. The work is done in private
modules: ``_conn`` (one connection), ``_pool`` (the connections, ``M``, the
round trip), ``_ops`` (the operations), ``_held`` (held locks, semaphores,
read/write locks), ``_watch`` (watches).
"""

from __future__ import annotations

import asyncio
import os
import ssl as _ssl
from types import TracebackType
from typing import Callable, overload

from . import errors
from ._held import READERS, HeldLock, LockContext, RWLock, Semaphore, keep_alive
from ._ops import Core
from ._pool import MAX_REDIRECT_ADDRS
from ._settings import Settings, settings
from ._types import Grant, Inspection, Lock, check_key, check_limit, grant_of
from ._watch import Watch

__all__ = [
    "Client",
    "Lock",
    "HeldLock",
    "LockContext",
    "Watch",
    "Inspection",
    "Semaphore",
    "RWLock",
    "Grant",
    "READERS",
    "MAX_REDIRECT_ADDRS",
    "tls_context",
]


def tls_context(
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
) -> _ssl.SSLContext:
    """Return a client :class:`ssl.SSLContext` for a lockd server with TLS (§8.1).

    ``ca`` is a PEM bundle to verify the server with (default: the system's
    trust store); ``cert`` and ``key`` a client certificate chain and its key
    for mutual TLS (``--tls-client-ca``; the certificate's Common Name may be
    the identity, §8.3). TLS 1.2 or later; the server's name is verified.
    """
    ctx = _ssl.create_default_context(cafile=ca)
    ctx.minimum_version = _ssl.TLSVersion.TLSv1_2
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    elif key is not None:
        raise errors.InvalidArgument("lockd: a TLS key without a certificate")
    return ctx


class Client:
    """A pipelined client for lockd servers; the entry point of every lock
    operation. Use one per process (per event loop) and share it between tasks.

    ::

        async with lockd.Client(["127.0.0.1:7070"]) as c:
            async with c.lock("orders/42", wait=5, lease=30) as lock:
                await store.write(order, token=lock.token)

    ``addrs`` lists the servers' ``host:port`` addresses (every member of a
    cluster). Durations are seconds. Connections start at ``async with``, at
    :meth:`connect` or at the first call, on the running event loop; the
    client must then only be used from that loop (see :class:`lockd.SyncClient`
    for threads). It logs to the ``"lockd"`` logger (:mod:`logging`):
    connections lost and refused, failed renewals and lost locks at WARNING,
    a new active member followed and compensating releases at INFO.

    How the client keeps PROTOCOL.md §7:

    - **Connections.** One persistent connection per address, two when one
      address is given (``conns_per_addr`` overrides). Requests are
      pipelined: every request made in one turn of the event loop is queued
      and the batch leaves in one write on the next turn; batches go
      round-robin over the live connections. A connection that drops is
      excluded at once and dialled again in the background every
      ``reconnect_interval`` (3 s); calls never wait on a dead connection.
    - **One owner, one deadline.** Each acquire draws one random owner and
      one deadline on the loop's monotonic clock (now + ``wait``); every
      resend reuses both. The wire ``wait`` is computed as the batch is
      written: the time left rounded up to whole seconds, capped at 255. A
      request still unsent at its deadline is never sent (:class:`Timeout`
      with a connection up, :class:`NoConnection` without).
    - **The caller's deadline decides.** When it passes before the server
      answered, the call raises :class:`Timeout` at that instant, to the
      millisecond (the server, asked to wait whole seconds, may answer
      later): the connection stays, and a grant that arrives for that
      request later is released at once, exact token, in the background
      with release's retries (a compensating release). ``T`` and ``B`` are
      definitive (:class:`Timeout`, :class:`Busy`).
    - **Resend only while definitely unsent.** A request is definitely unsent
      while it waits for its batch; if that connection dies first it goes to
      another one — and so does one written on a connection that the server
      refused before reading anything (see :class:`NoConnection`). Once
      possibly executed it is never resent: a lost connection gives
      :class:`Indeterminate`, and so does the transport deadline (the send
      plus the wire wait plus ``answer_allowance``, 1 s, for an acquire with
      a wait; the send plus ``transport_timeout`` otherwise) — a server that
      has not answered by then is taken to be broken, and that exact
      connection is closed, so the server releases a grant it had not yet
      written; the other requests on it are lost with it and say so.
    - **wait=0** is one server attempt with one ``transport_timeout`` (5 s)
      for the whole call: to find a connection, send and be answered.
    - **Release** retries for ``release_retry`` (5 s) every
      ``release_retry_interval`` (200 ms), across connections, on the exact
      token only, so a resend is harmless; if an earlier attempt may have
      executed, a later ``N`` counts as success. Renew retries the same way
      until ``transport_timeout``; each attempt's answer is awaited for a
      time that scales with the lease (a quarter of it, 0.25 s at least, at
      most ``transport_timeout``): an attempt a member does not answer in
      time (frozen, say) is sent to another member, early enough for the
      renewal to land before the lease ends, and the connection stays.
    - **M** (not executed): the address named becomes preferred (connections
      are opened to it if it is not in ``addrs``; at most
      :data:`MAX_REDIRECT_ADDRS` such addresses are kept) and the request is
      sent there at once with the same owner and deadline. An ``M`` without
      an address, or naming a node that is down or did not answer, pauses
      ``retry_pause`` (100 ms) and sends to another member, within the
      deadline; so does ``E`` 4 (shutting down, not executed). Everything
      goes to the preferred address until it answers ``M`` itself, dies or
      stops answering.

    And §8.6: with ``ssl`` (an :class:`ssl.SSLContext`, see
    :func:`tls_context`) every connection speaks TLS; with ``identity`` and
    ``secret`` (or ``secret_file``) every connection sends ``H`` before any
    request, and requests are pipelined behind it. A refused hello (``E`` 5)
    fails every request sent behind it with :class:`Unauthenticated`, which is
    definitive and not retried elsewhere; calls made while no connection is
    authenticated after a refusal fail with it at once. ``E`` 6 raises
    :class:`PermissionDenied`. The secret is never logged or shown by
    ``repr``. An ``identity`` without a secret sends no ``H``: the client
    certificate authenticates it. A TLS failure that a redial will not
    change (the server's certificate, or the server refusing ours) fails
    calls at once once every connection has met it, with
    :class:`NoConnection` whose ``cause`` is the :class:`ssl.SSLError`.

    Cancelling a call (``task.cancel()``, ``asyncio.wait_for``,
    ``asyncio.timeout``) keeps the connection and fails no other call on it:
    before the send nothing happens; after a possible send, the request's
    answer is awaited in the background, and a grant is released at once.
    The :class:`asyncio.CancelledError` propagates.

    And §9: :meth:`acquire_shared` (``S``) keeps every rule above exactly as
    :meth:`acquire` does (owner, deadline, compensating release of a late
    grant, cancellation), with :class:`LimitMismatch` for ``E`` 7;
    :meth:`semaphore` and :meth:`rw_lock` are built on it. :meth:`validate`,
    :meth:`watch` and :meth:`inspect` change nothing on the server, so each
    is sent again — another connection, another member — after a lost
    connection or an unanswered attempt, within ``transport_timeout``.
    **Every held lock is watched** (``watch_locks``, default True): its
    ``lost`` is set the moment lockd pushes ``L`` for it (released, expired,
    forced), not at the next renewal; after an ``L`` 4 or a lost connection
    it renews at once and registers the watch again where the key is
    served now. A connection that answered ``E`` 8 gets no watch until one
    of its watches ends (the watch goes to another connection); a lock
    that no connection has room for is left to its renewals and watched a
    renewal interval later. A server
    without §9 answers a §9 request ``E`` 1 and closes the connection: the
    call raises :class:`Unsupported`, the requests that shared the
    connection say why they were lost (those written after it were never
    read and go elsewhere), and §9 requests to that address fail at once
    without costing another connection until a connection to it ends
    otherwise (a restart). ``watch_locks=False`` sends no watch of its own.
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
        self._st: Settings = settings(
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
        self._core: Core | None = None
        self._closed = False

    def __repr__(self) -> str:
        st = self._st
        return f"lockd.Client({list(st.addrs)!r}, identity={st.identity!r}, tls={st.ssl is not None})"

    # Lifetime.

    async def __aenter__(self) -> Client:
        self._started()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Start the connections on the running loop (``async with`` and the
        first call do it too). It does not wait for them: calls wait for one
        within their deadlines."""
        self._started()

    def _started(self) -> Core:
        """The running core, started on the running loop at the first use."""
        if self._closed:
            raise errors.Closed("lockd: client closed")
        if self._core is None:
            self._core = Core(self._st, asyncio.get_running_loop())
        return self._core

    async def close(self) -> None:
        """Close every connection and end every task the client started.

        Pending calls fail with :class:`Closed`, or with
        :class:`ClosedIndeterminate` when they may have been executed (an
        acquire, release or renew possibly sent); later calls fail with
        :class:`Closed`. Held locks are not released: their holders see
        :class:`LockLost`, and the leases end them. Calling it again does
        nothing.
        """
        if self._closed:
            return
        self._closed = True
        if self._core is not None:
            await self._core.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def identity(self) -> str:
        """The identity a server last confirmed with ``H`` ("" if none yet)."""
        return self._core.pool.identity() if self._core is not None else ""

    def live_connections(self) -> int:
        """How many connections are up now."""
        return self._core.pool.live() if self._core is not None else 0

    # Operations.

    async def acquire(self, key: str, wait: float = 0.0, lease: float | None = None) -> Lock:
        """Take the lock on ``key``, waiting up to ``wait`` seconds (0..255)
        for it, with a lease of ``lease`` seconds (rounded up, 1..255; None:
        ``default_lease``). ``wait=0`` is one immediate attempt that never
        queues.

        Returns the :class:`Lock`. Raises :class:`Timeout` or :class:`Busy`
        (definitive: not granted; :class:`Timeout` exactly when the wait runs
        out), :class:`Indeterminate` (may or may not have been granted: do not
        enter the critical section), :class:`NoConnection`,
        :class:`Unauthenticated`, :class:`PermissionDenied`,
        :class:`ServerError`, :class:`Closed` or :class:`InvalidArgument`.
        """
        check_key(key)
        return await self._started().acquire(key, wait, lease)

    async def acquire_shared(self, key: str, limit: int, wait: float = 0.0, lease: float | None = None) -> Lock:
        """Take one of ``limit`` (1..65535) shared holds of ``key``
        (PROTOCOL.md §9.2: ``S``): granted while the key has fewer than
        ``limit`` holders and nobody waits before this request; a semaphore
        of ``limit`` permits, or (``limit`` 65535) a read/write lock's reader
        — an exclusive :meth:`acquire` of the key waits for every shared
        holder to leave, and shared requests behind it wait for it.

        ``wait`` and ``lease`` are :meth:`acquire`'s, and so is every rule
        and every exception; the :class:`Lock` it returns has its own token
        and lease (``limit`` set), and is released, renewed, validated and
        watched like any other. Raises :class:`LimitMismatch` (``E`` 7) when
        the key's holders gave another limit — definitive, nothing queued —
        and :class:`Unsupported` for a server without §9.
        """
        check_key(key)
        check_limit(limit)
        return await self._started().acquire(key, wait, lease, limit)

    @overload
    async def validate(self, grant: Grant, /) -> float: ...

    @overload
    async def validate(self, key: str, token: int, /) -> float: ...

    async def validate(self, key: Grant | str, token: int | None = None, /) -> float:
        """Ask lockd whether ``token`` is a current holder of ``key``
        (PROTOCOL.md §9.3: ``V``) — or pass a :class:`Lock` (a held lock) —
        and return its lease time left, in seconds (to the millisecond,
        rounded down). What a protected resource calls before acting for a
        request that carries a token. Changes nothing (it renews nothing).

        Raises :class:`NotHeld` — definitive: the token is not a current
        holder (released, expired, never issued, another key's) — or, when
        lockd could not be asked within ``transport_timeout``,
        :class:`NoConnection` or :class:`Timeout`; and
        :class:`PermissionDenied`, :class:`Unauthenticated`,
        :class:`Unsupported`, :class:`Closed`. Only :class:`NotHeld` and a
        returned value say anything about the token.
        """
        k, t = grant_of(key, token)
        check_key(k)
        return await self._started().validate(k, t)

    @overload
    async def watch(self, grant: Grant, /) -> Watch: ...

    @overload
    async def watch(self, key: str, token: int, /) -> Watch: ...

    async def watch(self, key: Grant | str, token: int | None = None, /) -> Watch:
        """Watch the grant ``token`` of ``key`` — or a :class:`Lock`, a held
        lock (PROTOCOL.md §9.4: ``W``): returns a :class:`Watch` once lockd
        registered it; ``await`` the watch (or ``async for`` over it) for
        the one end lockd pushes, with its :class:`Reason`::

            w = await c.watch(lock)
            reason = await w            # Reason.RELEASED, EXPIRED or FORCED

        The watch follows the grant across a failover: when the member can
        no longer tell (``L`` 4) or the connection is lost, it registers
        again where the key is served now (see :class:`Watch` for how it
        can end otherwise). Anyone allowed the key may watch any of its
        holders. Raises :class:`NotHeld` when the token is not a current
        holder, :class:`WatchLimit` when every connection refused another
        watch (``E`` 8), and :meth:`validate`'s other errors. The client's
        own held locks are watched without this (``watch_locks``).
        """
        k, t = grant_of(key, token)
        check_key(k)
        w = Watch(self._started(), k, t)
        try:
            await w._start()
        except BaseException:
            w.cancel()
            raise
        return w

    async def inspect(self, key: str) -> Inspection:
        """Return ``key``'s state now (PROTOCOL.md §9.5: ``I``): how many
        hold it and wait for it, its limit, and its newest holder's token
        and lease time left, as an :class:`Inspection`. Changes nothing.
        Raises :meth:`validate`'s errors but :class:`NotHeld`."""
        check_key(key)
        return await self._started().inspect(key)

    async def release(self, lock: Lock) -> None:
        """Release ``lock``.

        Retries for ``release_retry`` (5 s) every ``release_retry_interval``
        (200 ms), across connections, while attempts fail; a release acts on
        the exact token only, so a resend is harmless. Returns once the server
        answered ``R``. Raises :class:`NotHeld` for an ``N`` (the lease had
        ended, or it was released already) — unless an earlier attempt may
        have executed, in which case ``N`` means that attempt did and it
        returns —, :class:`Indeterminate` if no attempt could be confirmed,
        :class:`NoConnection` if none could be sent, or :class:`Closed`,
        :class:`ServerError`, :class:`PermissionDenied`,
        :class:`Unauthenticated`. The lease ends an unconfirmed lock.
        """
        check_key(lock.key)
        await self._started().release(lock)

    async def renew(self, lock: Lock, lease: float | None = None) -> Lock:
        """Restart ``lock``'s lease at ``lease`` seconds (None: the lock's own
        lease, else ``default_lease``) from the server's receipt, and return
        the lock with its new conservative ``expires``.

        An attempt whose connection is lost, or that a member does not
        answer within a transport timeout scaled to the lease, is retried
        (across connections and members, every ``retry_pause``) until
        ``transport_timeout``. Raises :class:`NotHeld` (the lock is gone),
        :class:`Indeterminate`, :class:`NoConnection`, :class:`Closed`,
        :class:`ServerError`, :class:`PermissionDenied`,
        :class:`Unauthenticated`.
        """
        check_key(lock.key)
        return await self._started().renew(lock, lease)

    async def ping(self) -> float:
        """Measure the round trip to a server, in seconds, over one of the
        client's connections (a cluster member that is not the active answers
        ``M``, which is followed). Raises :class:`NoConnection` if no
        connection was up within ``transport_timeout``, :class:`Timeout` if
        the pong did not come back within it, or :class:`Closed`."""
        return await self._started().ping()

    async def keep_alive(
        self,
        lock: Lock,
        *,
        lease: float | None = None,
        every: float | None = None,
        retry: float | None = None,
        margin: float = 0.0,
        on_renew_error: Callable[[BaseException], None] | None = None,
    ) -> HeldLock:
        """Start renewing ``lock`` in the background and return its
        :class:`HeldLock`.

        Each renewal asks for ``lease`` (None: the lock's own lease, else
        ``default_lease``), every ``every`` seconds (None: a third of the
        lease; sooner when less than two intervals are left before the stop
        time). A failed renewal is tried again after ``retry`` (None:
        ``retry_pause``); ``on_renew_error`` is called with each such error,
        and the first of a run is logged at WARNING. The lock is lost —
        :attr:`HeldLock.lost` is set — the moment lockd pushes ``L`` for it
        (the lock is watched unless ``watch_locks`` is False: released
        elsewhere, expired, forced), on an ``N``, on :meth:`close`, or when
        the stop time (``expires - margin``) passes without a renewal.

        If less than two intervals are left before the stop time (a lock
        granted after a long wait), it renews once first; that renewal's error
        is raised (an ``N`` as :class:`LockLost`).
        """
        check_key(lock.key)
        r = await keep_alive(self._started(), lock, lease, every, retry, margin, on_renew_error)
        return HeldLock(r)

    def lock(self, key: str, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0) -> LockContext:
        """An async context manager that holds ``key`` for its block::

            async with c.lock("orders/42", wait=5, lease=30) as lock:
                await store.write(order, token=lock.token)

        On entry it acquires (see :meth:`acquire` for the errors; the block
        does not run), then renews the lease in the background every third of
        it (:meth:`keep_alive`). On exit it stops the renewals and releases.

        **When the lock is lost** (lockd pushed ``L`` for it — released
        elsewhere, its lease expired, an operator released it —, a renewal
        answered ``N``, the client closed, or the stop time passed without
        a renewal), ``lock.lost`` is set and the task running the block is
        cancelled — at whatever
        ``await`` it is waiting — with :meth:`asyncio.Task.cancel`; the exit
        turns that cancellation into :class:`LockLost` (the way
        :func:`asyncio.timeout` turns its own into :class:`TimeoutError`), and
        a cancellation from elsewhere still propagates as
        :class:`asyncio.CancelledError`. Code in the block that runs without
        awaiting cannot be interrupted: check ``lock.lost`` before acting on
        the protected resource, and pass ``lock.token`` to it. A lost lock is
        raised at once: the release that may still help (the server
        unreachable, say) runs in the background.

        An exception from the block propagates after the release. Otherwise a
        lost lock raises :class:`LockLost`, and a release that failed raises
        its error (``N`` as :class:`LockLost`).
        """
        check_key(key)
        return LockContext(self._started, key, wait, lease, margin)

    def semaphore(
        self, key: str, limit: int, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0
    ) -> Semaphore:
        """A semaphore of ``limit`` permits on ``key`` (PROTOCOL.md §9.2):
        ``async with`` it to hold one permit for a block, as :meth:`lock`
        holds a lock (``wait``, ``lease`` and ``margin`` are its; a lost
        permit cancels the block with :class:`LockLost`)::

            async with c.semaphore("workers", 4, wait=30) as permit:
                await work(token=permit.token)

        Permits do not leak when a holder crashes: each has its own lease.
        Every user of the key must give the same ``limit``
        (:class:`LimitMismatch`). See :class:`Semaphore`.
        """
        return Semaphore(self._started, key, limit, wait, lease, margin)

    def rw_lock(self, key: str, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0) -> RWLock:
        """A read/write lock on ``key`` (PROTOCOL.md §9.2): ``async with
        rw.read()`` holds it shared with other readers, ``async with
        rw.write()`` alone, each as :meth:`lock` holds a lock; ``wait``,
        ``lease`` and ``margin`` are the defaults of both. A waiting writer
        holds up the readers that come after it. See :class:`RWLock`.
        """
        return RWLock(self._started, key, wait, lease, margin)
