"""The asyncio client: :class:`Client`, :class:`Lock`, :class:`HeldLock`.

The client keeps every obligation of PROTOCOL.md §7 and §8.6; the docstring
of :class:`Client` says how, rule by rule.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import ssl as _ssl
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, Coroutine

from . import errors
from ._conn import (
    RES_ABANDONED,
    RES_ANSWER,
    RES_EXPIRED,
    RES_REFUSED,
    RES_UNSENT,
    _Conn,
    _Req,
)
from .proto import (
    CODE_PERMISSION_DENIED,
    CODE_SHUTDOWN,
    CODE_UNAUTHENTICATED,
    MAX_KEY,
    MAX_SECRET,
    MAX_WAIT,
    OP_ACQUIRE,
    OP_BUSY,
    OP_ERROR,
    OP_MOVED,
    OP_NOT_HELD,
    OP_PING,
    OP_RELEASE,
    OP_RENEW,
    OP_TIMEOUT,
    op_name,
)

__all__ = ["Client", "Lock", "HeldLock", "LockContext", "MAX_REDIRECT_ADDRS", "tls_context"]

MAX_REDIRECT_ADDRS = 8
"""Addresses beyond the configured ones that a client keeps connections to
because an ``M`` answer named them; the one least recently named is dropped
first (no new request goes there; its connections close once idle)."""

_RETIRE_POLL = 0.05

# Outcomes of one round trip, the waiter's view of one request.
_OUT_ANSWER = 0
_OUT_NOT_SENT = 1  # the send deadline passed before it was sent
_OUT_NO_CONN = 2  # the send deadline passed with no connection available
_OUT_LOST = 3  # the connection died with the request possibly sent
_OUT_ABANDONED = 4  # the answer deadline passed with the request possibly sent
_OUT_CLOSED = 5  # the client was closed before it was sent
_OUT_REFUSED = 6  # the server refused the identity: req.rerr

_IDENTITY_RE = re.compile(rb"[A-Za-z0-9._@-]{1,64}\Z")


@dataclass(frozen=True, slots=True)
class Lock:
    """A granted lock.

    ``token`` is the fencing token: pass it to the resource the lock protects
    (see :mod:`lockd.fence`). ``expires`` is the client's conservative
    estimate of the lease's end, on the event loop's clock (``loop.time()``,
    which is :func:`time.monotonic` for asyncio's default loop and for
    :class:`lockd.SyncClient`): the instant the granting (or last renewing)
    request was sent plus the lease. The server's lease counts from the
    request's arrival or later, so it never ends before ``expires``.
    """

    key: str
    token: int
    expires: float


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


def _split_addr(a: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port``); raise InvalidArgument."""
    host, sep, port = a.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.InvalidArgument(f"lockd: bad address {a!r}: want host:port")
    return host, int(port)


def _check_key(key: str) -> bytes:
    """The key's UTF-8 bytes; raise InvalidKey if it cannot be sent."""
    if not isinstance(key, str):
        raise errors.InvalidKey(f"lockd: key must be a str, not {type(key).__name__}")
    try:
        kb = key.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidKey(f"lockd: key {key!r} is not valid UTF-8") from None
    if not kb or len(kb) > MAX_KEY or b"\n" in kb:
        raise errors.InvalidKey(f"lockd: invalid key {key[:64]!r}: want 1..1024 bytes of UTF-8 without a newline")
    return kb


def _fresh(err: BaseException) -> BaseException:
    """A copy of a shared error, so that raising it from several tasks does
    not chain their tracebacks together."""
    cls = type(err)
    e = cls.__new__(cls, *err.args)
    e.args = err.args
    e.__dict__.update(err.__dict__)
    e.__traceback__ = None
    return e


class _Slot:
    """One persistent connection's place: its address and current connection
    (None while down). A task per slot dials, watches and redials it."""

    __slots__ = ("addr", "conn", "down", "redial", "redirect", "named", "retired", "task")

    def __init__(self, addr: str, redirect: bool, loop: asyncio.AbstractEventLoop) -> None:
        self.addr = addr
        self.conn: _Conn | None = None
        self.down = False  # its last dial failed or its connection ended, and it is not up again
        self.redial = asyncio.Event()  # an M named addr: cut the pause before the next dial short
        self.redirect = redirect  # opened for an address an M named, not in the configured list
        self.named = 0.0  # the latest M naming addr
        self.retired: asyncio.Future[None] = loop.create_future()  # done when evicted
        self.task: asyncio.Task[None] | None = None


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
    for threads).

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
    - **Resend only while definitely unsent.** A request is definitely unsent
      while it waits for its batch; if that connection dies first it goes to
      another one. Once written it is never resent: a lost connection gives
      :class:`Indeterminate`, and so does the answer deadline (the send plus
      the wire wait plus ``answer_allowance``, 1 s, so that a ``T`` sent at
      the end of the wait stays definitive), which also closes that exact
      connection, so the server releases a grant it had not yet written.
    - **The delivery gate.** An ``A`` taken after the call's deadline (or by
      a cancelled caller, or after close) is released again in the background
      with release's retries, and the call raises :class:`Indeterminate`.
      ``T`` and ``B`` are definitive (:class:`Timeout`, :class:`Busy`).
    - **wait=0** is one server attempt with one ``transport_timeout`` (5 s)
      for the whole call: to find a connection, send and be answered.
    - **Release** retries for ``release_retry`` (5 s) every
      ``release_retry_interval`` (200 ms), across connections, on the exact
      token only, so a resend is harmless; if an earlier attempt may have
      executed, a later ``N`` counts as success. Renew retries the same way
      until ``transport_timeout``.
    - **M** (not executed): the address named becomes preferred (connections
      are opened to it if it is not in ``addrs``; at most
      :data:`MAX_REDIRECT_ADDRS` such addresses are kept) and the request is
      sent there at once with the same owner and deadline. An ``M`` without
      an address, or naming a node that is down, pauses ``retry_pause``
      (100 ms) and sends to another member, within the deadline; so does
      ``E`` 4 (shutting down, not executed). Everything goes to the preferred
      address until it answers ``M`` itself or dies.

    And §8.6: with ``ssl`` (an :class:`ssl.SSLContext`, see
    :func:`tls_context`) every connection speaks TLS; with ``identity`` and
    ``secret`` (or ``secret_file``) every connection sends ``H`` before any
    request, and requests are pipelined behind it. A refused hello (``E`` 5)
    fails every request sent behind it with :class:`Unauthenticated`, which is
    definitive and not retried elsewhere; calls made while no connection is
    authenticated after a refusal fail with it at once. ``E`` 6 raises
    :class:`PermissionDenied`. The secret is never logged or shown by
    ``repr``. An ``identity`` without a secret sends no ``H``: the client
    certificate authenticates it.

    Cancelling a call (``task.cancel()``, ``asyncio.timeout``) follows the same
    rules as the deadline: before the send, nothing happens; after a possible
    send, the exact connection is closed for an acquire and a grant that still
    arrives is released. The :class:`asyncio.CancelledError` propagates.
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
        if isinstance(addrs, str):
            raise errors.InvalidArgument("lockd: addrs must be a list of host:port strings, not one string")
        if not addrs:
            raise errors.InvalidArgument("lockd: no server addresses")
        for a in addrs:
            _split_addr(a)
        if not 0 <= conns_per_addr <= 64:
            raise errors.InvalidArgument("lockd: conns_per_addr must be 0..64")
        if conns_per_addr == 0:
            conns_per_addr = 2 if len(addrs) == 1 else 1
        for name, v in (
            ("dial_timeout", dial_timeout),
            ("reconnect_interval", reconnect_interval),
            ("transport_timeout", transport_timeout),
            ("answer_allowance", answer_allowance),
            ("release_retry", release_retry),
            ("release_retry_interval", release_retry_interval),
            ("retry_pause", retry_pause),
            ("default_lease", default_lease),
        ):
            if not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
                raise errors.InvalidArgument(f"lockd: {name} must be a positive number of seconds")
        if default_lease > MAX_WAIT:
            raise errors.InvalidLease("lockd: default_lease must be at most 255 s")
        if ssl is not None and not isinstance(ssl, _ssl.SSLContext):
            raise errors.InvalidArgument("lockd: ssl must be an ssl.SSLContext")
        if server_hostname is not None and ssl is None:
            raise errors.InvalidArgument("lockd: server_hostname needs ssl")
        self._addrs = list(addrs)
        self._ssl = ssl
        self._server_hostname = server_hostname
        self._identity = identity
        self._hello_tail = self._make_hello(identity, secret, secret_file)
        self._conns_per_addr = conns_per_addr
        self._dial_timeout = float(dial_timeout)
        self._reconnect_interval = float(reconnect_interval)
        self._transport_timeout = float(transport_timeout)
        self._answer_allowance = float(answer_allowance)
        self._release_retry = float(release_retry)
        self._release_retry_interval = float(release_retry_interval)
        self._retry_pause = float(retry_pause)
        self._default_lease = float(default_lease)
        self._fail_fast = fail_fast
        self._rand = random.Random(int.from_bytes(os.urandom(16), "big"))

        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by connect
        self._started = False
        self._closed = False
        self._slots: list[_Slot] = []
        self._preferred = ""  # the address an M pointed to
        self._rr = 0
        self._established = False  # a server's answer has been read on some connection
        self._conn_err: BaseException | None = None  # why the last dial failed or connection ended
        self._auth_err: BaseException | None = None  # the last refused hello, until one succeeds
        self._changed: asyncio.Event = None  # type: ignore[assignment]
        self._closing: asyncio.Event = None  # type: ignore[assignment]
        self._bg: set[asyncio.Task[None]] = set()

    @staticmethod
    def _make_hello(
        identity: str | None, secret: str | bytes | None, secret_file: str | os.PathLike[str] | None
    ) -> bytes | None:
        if secret is not None and secret_file is not None:
            raise errors.InvalidArgument("lockd: give secret or secret_file, not both")
        if secret_file is not None:
            with open(secret_file, "rb") as f:
                secret = f.read()
            if secret.endswith(b"\r\n"):
                secret = secret[:-2]
            elif secret.endswith(b"\n"):
                secret = secret[:-1]
        if identity is None:
            if secret is not None:
                raise errors.InvalidArgument("lockd: a secret without an identity")
            return None
        ib = identity.encode("utf-8", "replace")
        if not _IDENTITY_RE.match(ib):
            raise errors.InvalidArgument("lockd: identity must be 1..64 characters of A-Z a-z 0-9 . _ @ -")
        if secret is None:
            return None  # authenticated by the client certificate: no H
        sb = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        if not sb or len(sb) > MAX_SECRET or b"\n" in sb:
            raise errors.InvalidArgument("lockd: the secret must be 1..256 bytes without a newline")
        return ib + b" " + sb

    def __repr__(self) -> str:
        return f"lockd.Client({self._addrs!r}, identity={self._identity!r}, tls={self._ssl is not None})"

    # Lifetime.

    async def __aenter__(self) -> Client:
        self._ensure()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Start the connections on the running loop (``async with`` and the
        first call do it too). It does not wait for them: calls wait for one
        within their deadlines."""
        self._ensure()

    def _ensure(self) -> None:
        if self._closed:
            raise errors.Closed("lockd: client closed")
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._started = True
        for _ in range(self._conns_per_addr):
            for a in self._addrs:
                self._add_slot(a, False)

    def _add_slot(self, addr: str, redirect: bool) -> _Slot:
        s = _Slot(addr, redirect, self._loop)
        s.named = self._loop.time()
        self._slots.append(s)
        s.task = self._loop.create_task(self._run_slot(s))
        return s

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
        if not self._started:
            return
        self._closing.set()
        self._signal_changed()
        tasks: list[asyncio.Task[None]] = []
        for s in self._slots:
            if s.task is not None:
                s.task.cancel()
                tasks.append(s.task)
            if s.conn is not None:
                s.conn.fail(errors.Closed("lockd: client closed"))
        bg = list(self._bg)
        await asyncio.gather(*tasks, *bg, return_exceptions=True)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def identity(self) -> str:
        """The identity a server last confirmed with ``H`` ("" if none yet)."""
        for s in self._slots:
            c = s.conn
            if c is not None and not c.dead and c.identity:
                return c.identity
        return ""

    def live_connections(self) -> int:
        """How many connections are up now."""
        return sum(1 for s in self._slots if s.conn is not None and not s.conn.dead)

    def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        t = self._loop.create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg_done)
        return t

    def _bg_done(self, t: asyncio.Task[None]) -> None:
        self._bg.discard(t)
        if not t.cancelled():
            t.exception()  # retrieved: errors of background work are not logged

    def _rand64(self) -> int:
        return self._rand.getrandbits(64)

    # Connection slots.

    async def _run_slot(self, s: _Slot) -> None:
        """Keep one persistent connection: dial, serve until it dies, wait
        ``reconnect_interval`` (or until an M names the address), dial again."""
        loop = self._loop
        while True:
            err: BaseException
            try:
                conn = await self._dial(s.addr)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if isinstance(e, errors.LockdError):
                    err = e
                else:
                    err = ConnectionError(f"dial {s.addr}: {e}")
                    err.__cause__ = e
            else:
                s.conn = conn
                s.down = False
                if self._hello_tail is None:
                    # No hello to confirm an identity: an E 5 seen before
                    # no longer says anything about this connection.
                    self._auth_err = None
                self._signal_changed()
                try:
                    await asyncio.wait([conn.gone, s.retired], return_when=asyncio.FIRST_COMPLETED)
                    if s.retired.done() and not conn.dead:
                        while not conn.dead and not conn.idle():
                            await asyncio.wait([conn.gone], timeout=_RETIRE_POLL)
                        conn.fail(errors.LockdError("connection to an address no M has named lately, closed once idle"))
                finally:
                    if self._closed:
                        conn.fail(errors.Closed("lockd: client closed"))
                s.conn = None
                err = conn.end_cause()
            if self._closed or s.retired.done():
                return
            self._conn_err = err
            s.down = True
            self._signal_changed()
            s.redial.clear()
            try:
                async with asyncio.timeout_at(loop.time() + self._reconnect_interval):
                    await s.redial.wait()
            except TimeoutError:
                pass
            if s.retired.done():
                return

    async def _dial(self, addr: str) -> _Conn:
        host, port = _split_addr(addr)
        loop = self._loop
        hello = self._hello_tail
        async with asyncio.timeout(self._dial_timeout):
            _, conn = await loop.create_connection(
                lambda: _Conn(self, addr, hello),
                host,
                port,
                ssl=self._ssl,
                server_hostname=(self._server_hostname or host) if self._ssl is not None else None,
            )
        return conn

    def _signal_changed(self) -> None:
        old = self._changed
        self._changed = asyncio.Event()
        old.set()

    def _hello_ok(self) -> None:
        self._auth_err = None

    def _auth_refused(self, err: BaseException) -> None:
        self._auth_err = err
        self._conn_err = err

    def _unreachable(self) -> bool:
        """No server was reached yet and every slot has failed once."""
        if self._established:
            return False
        return all(s.down for s in self._slots)

    def _no_conn_err(self) -> errors.NoConnection:
        c = self._conn_err
        return errors.NoConnection(cause=_fresh(c) if c is not None else None)

    def _pick(self, addr: str, avoid: str) -> _Conn | None:
        """A live connection: to ``addr`` if set (None if none is up), else to
        the preferred address if one is up, else the next live one in
        round-robin order, passing over ``avoid`` while there is another."""
        slots = self._slots
        n = len(slots)
        i0 = self._rr
        if not addr and self._preferred:
            c = self._pick_addr(self._preferred)
            if c is not None:
                return c
        if addr:
            return self._pick_addr(addr)
        fallback = None
        for i in range(n):
            s = slots[(i0 + i) % n]
            c = s.conn
            if c is not None and not c.dead:
                if not avoid or s.addr != avoid:
                    return c
                if fallback is None:
                    fallback = c
        return fallback

    def _pick_addr(self, addr: str) -> _Conn | None:
        slots = self._slots
        n = len(slots)
        i0 = self._rr
        for i in range(n):
            s = slots[(i0 + i) % n]
            if s.addr != addr:
                continue
            c = s.conn
            if c is not None and not c.dead:
                return c
        return None

    def _follow(self, addr: str) -> None:
        """Make ``addr`` (named by an M) the preferred address, opening
        connections to it if it has none; beyond MAX_REDIRECT_ADDRS such
        addresses, the least recently named is evicted."""
        if self._closed:
            return
        self._preferred = addr
        now = self._loop.time()
        known = False
        for s in self._slots:
            if s.addr == addr:
                known = True
                if s.redirect:
                    s.named = now
        if known:
            return
        redirects: dict[str, float] = {}
        for s in self._slots:
            if s.redirect:
                redirects[s.addr] = s.named
        if len(redirects) >= MAX_REDIRECT_ADDRS:
            victim = min(redirects, key=lambda a: redirects[a])
            keep = []
            for s in self._slots:
                if s.addr == victim:
                    if not s.retired.done():
                        s.retired.set_result(None)
                    s.redial.set()
                    continue
                keep.append(s)
            self._slots = keep
        for _ in range(self._conns_per_addr):
            self._add_slot(addr, True)

    def _unreachable_addr(self, addr: str) -> bool:
        """No request can go to ``addr`` now (no slot, or every slot down);
        its down slots are told to dial again at once: an M named it."""
        reachable = False
        for s in self._slots:
            if s.addr != addr:
                continue
            if not s.down:
                reachable = True
                continue
            s.redial.set()
        return not reachable

    def _unprefer(self, addr: str) -> None:
        if self._preferred == addr:
            self._preferred = ""

    def _compensate(self, key: str, token: int) -> None:
        """Release, in the background with release's retries, a grant the
        caller will never see."""
        if self._closed:
            return

        async def rel() -> None:
            try:
                await self.release(Lock(key, token, 0.0))
            except errors.LockdError:
                pass

        self._spawn(rel())

    # The request cycle.

    def _try_send(self, r: _Req) -> bool:
        """Attach ``r`` to a live connection, if one is available now."""
        while True:
            c = self._pick(r.moved, r.avoid)
            if c is None:
                if r.moved and self._unreachable_addr(r.moved):
                    r.avoid, r.moved = r.moved, ""
                    continue
                return False
            if c.enqueue(r):
                return True

    async def _wait_conn(self, r: _Req) -> int:
        """Wait until a connection may be available: -1, or an outcome that
        ends the attempt."""
        ev = self._changed
        if self._try_send(r):
            return -1
        if self._closed:
            return _OUT_CLOSED
        if self._auth_err is not None:
            r.rerr = self._auth_err
            return _OUT_REFUSED
        if self._loop.time() >= r.send_by or (self._fail_fast and self._unreachable()):
            return _OUT_NO_CONN
        try:
            async with asyncio.timeout_at(r.send_by):
                await ev.wait()
        except TimeoutError:
            return _OUT_NO_CONN
        return -1

    async def _round_trip(self, r: _Req) -> int:
        """Send ``r`` and wait for its answer, resending on another connection
        only while it is definitely unsent."""
        while True:
            if r.conn is None:
                if self._closed:
                    return _OUT_CLOSED
                if not self._try_send(r):
                    o = await self._wait_conn(r)
                    if o >= 0:
                        return o
                    continue
            c = r.conn
            fut = r.fut
            assert c is not None and fut is not None
            try:
                await fut
            except asyncio.CancelledError:
                c.cancel_attempt(r)
                raise
            r.conn = None
            r.fut = None
            r.from_addr = c.addr
            res = r.res
            if res == RES_ANSWER:
                return _OUT_ANSWER
            if res == RES_UNSENT:
                continue
            if res == RES_EXPIRED:
                return _OUT_NOT_SENT
            if res == RES_ABANDONED:
                return _OUT_ABANDONED
            if res == RES_REFUSED:
                return _OUT_REFUSED
            return _OUT_LOST

    async def _sleep(self, d: float, limit: float) -> bool:
        """Pause ``d``; False if the client closed or ``limit`` came first
        (then it returns at ``limit``: a call does not give up early)."""
        at = self._loop.time() + d
        ok = at < limit
        if not ok:
            at = limit
        if self._closed:
            return False
        try:
            async with asyncio.timeout_at(at):
                await self._closing.wait()
        except TimeoutError:
            return ok
        return False

    def _follow_moved(self, r: _Req) -> bool:
        """Act on an M: an address becomes preferred and the request goes
        there next (True: resend at once). An empty address (or one that
        cannot be used) drops the preference for the node that said so, and
        after a pause (False) the request goes to another node."""
        addr = r.rtail
        if addr:
            try:
                _split_addr(addr)
            except errors.InvalidArgument:
                addr = ""
        if addr:
            self._follow(addr)
            if self._unreachable_addr(addr):
                # The node named is down: the one that answered may not know
                # yet. Pause, then ask another.
                r.moved, r.avoid = "", addr
                return False
            r.moved = addr
            return True
        r.moved = ""
        r.avoid = r.from_addr
        self._unprefer(r.from_addr)
        return False

    def _pause_ended(self, r: _Req) -> errors.LockdError:
        if self._closed:
            return errors.Closed("lockd: client closed")
        if r.op == OP_ACQUIRE and not r.wait0:
            return errors.Timeout(f"lockd: timed out, not acquired: {r.key!r} (no active member answered in time)")
        return self._no_conn_err()

    def _lease_secs(self, lease: float | None) -> int:
        if lease is None:
            lease = self._default_lease
        if not isinstance(lease, (int, float)) or not 0 < lease <= MAX_WAIT:
            raise errors.InvalidLease(f"lockd: lease must be in (0, 255] seconds, not {lease!r}")
        return math.ceil(lease)

    def _server_error(self, r: _Req) -> errors.LockdError:
        code = r.rcode
        if code == CODE_PERMISSION_DENIED:
            return errors.PermissionDenied(r.key, r.rtail)
        if code == CODE_UNAUTHENTICATED:
            return errors.Unauthenticated(f"lockd: unauthenticated: {r.rtail}", r.rtail)
        return errors.ServerError(op_name(r.op), code, r.rtail)

    # Operations.

    async def acquire(self, key: str, wait: float = 0.0, lease: float | None = None) -> Lock:
        """Take the lock on ``key``, waiting up to ``wait`` seconds (0..255)
        for it, with a lease of ``lease`` seconds (rounded up, 1..255; None:
        ``default_lease``). ``wait=0`` is one immediate attempt that never
        queues.

        Returns the :class:`Lock`. Raises :class:`Timeout` or :class:`Busy`
        (definitive: not granted), :class:`Indeterminate` (may or may not have
        been granted: do not enter the critical section), :class:`NoConnection`,
        :class:`Unauthenticated`, :class:`PermissionDenied`,
        :class:`ServerError`, :class:`Closed` or :class:`InvalidArgument`.
        """
        kb = _check_key(key)
        if not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT:
            raise errors.InvalidWait(f"lockd: wait must be 0..255 seconds, not {wait!r}")
        ls = self._lease_secs(lease)
        self._ensure()
        loop = self._loop
        r = _Req(OP_ACQUIRE, key, kb, self._rand.getrandbits(64), ls)
        now = loop.time()
        if wait == 0:
            r.wait0 = True
            r.send_by = r.hard_by = now + self._transport_timeout
            r.timeout = self._transport_timeout
        else:
            r.wait_end = r.send_by = now + wait
            r.allowance = self._answer_allowance
        while True:
            o = await self._round_trip(r)
            if o != _OUT_ANSWER:
                if o == _OUT_NOT_SENT:
                    if r.wait0:
                        raise self._no_conn_err()
                    raise errors.Timeout(f"lockd: timed out, not acquired: {key!r} (not sent before the deadline)")
                if o == _OUT_NO_CONN:
                    raise self._no_conn_err()  # an outage, not a holder: never Timeout
                if o == _OUT_CLOSED:
                    raise errors.Closed("lockd: client closed")
                if o == _OUT_REFUSED:
                    assert r.rerr is not None
                    raise _fresh(r.rerr)
                if self._closed:
                    raise errors.ClosedIndeterminate("lockd: closed with the acquire possibly sent (outcome indeterminate)")
                raise errors.Indeterminate(
                    f"lockd: acquire of {key!r}: outcome indeterminate, do not assume the lock is held"
                    + (" (connection lost)" if o == _OUT_LOST else " (no answer in time)")
                )
            rop = r.rop
            if rop == OP_ACQUIRE:
                # The delivery gate: a grant taken after the call's deadline
                # (or after close) is released again.
                if loop.time() >= r.call_end() or self._closed:
                    self._compensate(key, r.rtoken)
                    if self._closed:
                        raise errors.ClosedIndeterminate("lockd: closed as the grant arrived (released again)")
                    raise errors.Indeterminate(
                        f"lockd: acquire of {key!r}: the grant came after the deadline and is being released again"
                    )
                return Lock(key, r.rtoken, r.sent_at + ls)
            if rop == OP_TIMEOUT:
                raise errors.Timeout(f"lockd: timed out, not acquired: {key!r} is held")
            if rop == OP_BUSY:
                raise errors.Busy(f"lockd: server busy, not acquired: {key!r}")
            if rop == OP_MOVED:
                if self._follow_moved(r):
                    continue
            elif rop == OP_ERROR:
                if r.rcode != CODE_SHUTDOWN:
                    raise self._server_error(r)
            else:
                raise errors.ServerError("acquire", 0, f"unexpected answer {op_name(rop)}")
            # Not executed, nowhere to go: pause, then send again (same
            # owner, same deadline).
            if not await self._sleep(self._retry_pause, r.send_by):
                raise self._pause_ended(r)

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
        kb = _check_key(lock.key)
        self._ensure()
        r = _Req(OP_RELEASE, lock.key, kb, lock.token, 0)
        r.hard_by = r.send_by = self._loop.time() + self._release_retry
        r.timeout = self._transport_timeout
        await self._retrying(r, r.hard_by, self._release_retry_interval)

    async def renew(self, lock: Lock, lease: float | None = None) -> Lock:
        """Restart ``lock``'s lease at ``lease`` seconds (None:
        ``default_lease``) from the server's receipt, and return the lock with
        its new conservative ``expires``.

        An attempt whose connection is lost is retried (across connections,
        every ``retry_pause``) until ``transport_timeout``. Raises
        :class:`NotHeld` (the lock is gone), :class:`Indeterminate`,
        :class:`NoConnection`, :class:`Closed`, :class:`ServerError`,
        :class:`PermissionDenied`, :class:`Unauthenticated`.
        """
        kb = _check_key(lock.key)
        ls = self._lease_secs(lease)
        self._ensure()
        r = _Req(OP_RENEW, lock.key, kb, lock.token, ls)
        limit = self._loop.time() + self._transport_timeout
        r.hard_by = r.send_by = limit
        r.timeout = self._transport_timeout
        await self._retrying(r, limit, self._retry_pause)
        return Lock(lock.key, lock.token, r.sent_at + ls)

    async def _retrying(self, r: _Req, limit: float, pause: float) -> None:
        """Run a release or renew: both act only on the exact token, so the
        client resends after a lost connection, until ``limit``."""
        maybe = False  # an earlier attempt may have executed

        def closed() -> errors.LockdError:
            if maybe:
                return errors.ClosedIndeterminate("lockd: closed with the request possibly sent (outcome indeterminate)")
            return errors.Closed("lockd: client closed")

        loop = self._loop
        while True:
            if self._closed:
                raise closed()
            o = await self._round_trip(r)
            if o == _OUT_ANSWER:
                rop = r.rop
                if rop == OP_RELEASE or rop == OP_RENEW:
                    return
                if rop == OP_NOT_HELD:
                    if maybe and r.op == OP_RELEASE:
                        return
                    raise errors.NotHeld(f"lockd: lock not held: {r.key!r} token {r.id}")
                if rop == OP_MOVED:
                    if self._follow_moved(r):
                        continue
                elif rop == OP_ERROR:
                    if r.rcode != CODE_SHUTDOWN:
                        raise self._server_error(r)
                else:
                    raise errors.ServerError(op_name(r.op), 0, f"unexpected answer {op_name(rop)}")
            elif o == _OUT_CLOSED:
                raise closed()
            elif o == _OUT_LOST or o == _OUT_ABANDONED:
                maybe = True
            elif o == _OUT_REFUSED:
                assert r.rerr is not None
                raise _fresh(r.rerr)
            elif o == _OUT_NO_CONN:
                if not maybe:
                    raise self._no_conn_err()
            if loop.time() >= limit or not await self._sleep(pause, limit):
                if self._closed:
                    raise closed()
                if maybe:
                    raise errors.Indeterminate(
                        f"lockd: {op_name(r.op)} of {r.key!r}: no attempt could be confirmed in time"
                    )
                raise self._no_conn_err()

    async def ping(self) -> float:
        """Measure the round trip to a server, in seconds, over one of the
        client's connections (a cluster member that is not the active answers
        ``M``, which is followed). Raises :class:`NoConnection` if no
        connection was up within ``transport_timeout``, :class:`Timeout` if
        the pong did not come back within it, or :class:`Closed`."""
        self._ensure()
        loop = self._loop
        r = _Req(OP_PING, "", b"", self._rand.getrandbits(64), 0)
        limit = loop.time() + self._transport_timeout
        r.send_by = r.hard_by = limit
        r.timeout = self._transport_timeout
        while True:
            o = await self._round_trip(r)
            if o == _OUT_ANSWER:
                if r.rop == OP_PING:
                    return loop.time() - r.sent_at
                if r.rop == OP_MOVED and self._follow_moved(r):
                    continue
                if not await self._sleep(self._retry_pause, limit):
                    raise self._pause_ended(r)
            elif o == _OUT_LOST:
                if self._closed:
                    raise errors.Closed("lockd: client closed")
            elif o == _OUT_ABANDONED:
                raise errors.Timeout("lockd: no pong within the transport timeout")
            elif o == _OUT_CLOSED:
                raise errors.Closed("lockd: client closed")
            elif o == _OUT_REFUSED:
                assert r.rerr is not None
                raise _fresh(r.rerr)
            else:
                raise self._no_conn_err()

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

        Each renewal asks for ``lease`` (None: ``default_lease``), every
        ``every`` seconds (None: a third of the lease; sooner when less than
        two intervals are left before the stop time). A failed renewal is
        tried again after ``retry`` (None: ``retry_pause``);
        ``on_renew_error`` is called with each such error. The lock is lost
        — :attr:`HeldLock.lost` is set — on an ``N``, on :meth:`close`, or
        when the stop time (``expires - margin``) passes without a renewal.

        If less than two intervals are left before the stop time (a lock
        granted after a long wait), it renews once first; that renewal's error
        is raised (an ``N`` as :class:`LockLost`).
        """
        _check_key(lock.key)
        ls = self._lease_secs(lease)
        if every is None:
            every = ls / 3
        if retry is None:
            retry = self._retry_pause
        if not every > 0 or not retry > 0 or not 0 <= margin < ls:
            raise errors.InvalidArgument("lockd: every and retry must be positive, and margin in [0, lease)")
        self._ensure()
        if lock.expires - margin - self._loop.time() < 2 * every:
            try:
                lock = await self.renew(lock, ls)
            except errors.NotHeld as e:
                raise errors.LockLost("lockd: lock lost: a renewal was answered N (not held)", e) from e
        h = HeldLock(self, lock, ls, every, retry, margin, on_renew_error)
        h._task = self._spawn(h._run())
        return h

    def lock(self, key: str, *, wait: float = 0.0, lease: float | None = None, margin: float = 0.0) -> LockContext:
        """An async context manager that holds ``key`` for its block::

            async with c.lock("orders/42", wait=5, lease=30) as lock:
                await store.write(order, token=lock.token)

        On entry it acquires (see :meth:`acquire` for the errors; the block
        does not run), then renews the lease in the background every third of
        it (:meth:`keep_alive`). On exit it stops the renewals and releases.

        **When the lock is lost** (a renewal answered ``N``, the client
        closed, or the stop time passed without a renewal), ``lock.lost`` is
        set and the task running the block is cancelled — at whatever
        ``await`` it is waiting — with :meth:`asyncio.Task.cancel`; the exit
        turns that cancellation into :class:`LockLost` (the way
        :func:`asyncio.timeout` turns its own into :class:`TimeoutError`), and
        a cancellation from elsewhere still propagates as
        :class:`asyncio.CancelledError`. Code in the block that runs without
        awaiting cannot be interrupted: check ``lock.lost`` before acting on
        the protected resource, and pass ``lock.token`` to it.

        An exception from the block propagates after the release. Otherwise a
        lost lock raises :class:`LockLost`, and a release that failed raises
        its error (``N`` as :class:`LockLost`).
        """
        _check_key(key)
        return LockContext(self, key, wait, lease, margin)


class HeldLock:
    """A lock renewed in the background (from :meth:`Client.keep_alive` or
    :meth:`Client.lock`).

    ``lost`` is set when the lock is lost; ``error`` then says why (a
    :class:`LockLost`, whose ``reason`` is :class:`NotHeld`, :class:`Closed`
    or None for a stop time that passed). A holder must stop touching the
    protected resource by :attr:`stop_by`, and pass :attr:`token` to it.
    A :class:`HeldLock` never releases the lock: :meth:`stop` it, then
    release.
    """

    def __init__(
        self,
        cl: Client,
        lock: Lock,
        lease: int,
        every: float,
        retry: float,
        margin: float,
        on_renew_error: Callable[[BaseException], None] | None,
    ) -> None:
        self._cl = cl
        self._lock = lock
        self._lease = lease
        self._every = every
        self._retry = retry
        self._margin = margin
        self._on_renew_error = on_renew_error
        self._task: asyncio.Task[None] | None = None
        self._callbacks: list[Callable[[errors.LockLost], None]] = []
        self.lost = asyncio.Event()
        """Set when the lock is lost."""
        self.error: errors.LockLost | None = None
        """None while the lock is not lost; then why."""

    def __repr__(self) -> str:
        return f"lockd.HeldLock(key={self.key!r}, token={self.token}, lost={self.lost.is_set()})"

    @property
    def lock(self) -> Lock:
        """The lock, with the ``expires`` of its latest renewal."""
        return self._lock

    @property
    def key(self) -> str:
        """The key."""
        return self._lock.key

    @property
    def token(self) -> int:
        """The fencing token: pass it to the protected resource."""
        return self._lock.token

    @property
    def expires(self) -> float:
        """The conservative end of the lease after the latest renewal (loop clock)."""
        return self._lock.expires

    @property
    def stop_by(self) -> float:
        """When the holder must have stopped unless a renewal moves it:
        ``expires - margin`` (loop clock)."""
        return self._lock.expires - self._margin

    def add_lost_callback(self, fn: Callable[[errors.LockLost], None]) -> None:
        """Call ``fn(error)`` on the event loop when the lock is lost (at once
        if it is lost already)."""
        if self.error is not None:
            fn(self.error)
            return
        self._callbacks.append(fn)

    async def stop(self) -> errors.LockLost | None:
        """End the renewals (one in flight is abandoned) and return
        :attr:`error`. It does not release the lock."""
        t = self._task
        if t is not None and not t.done():
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                if not t.cancelled():
                    raise
        return self.error

    def _lose(self, err: errors.LockLost) -> None:
        if self.error is not None:
            return
        self.error = err
        self.lost.set()
        for fn in self._callbacks:
            fn(err)
        self._callbacks.clear()

    def _next_renewal(self) -> float:
        left = self.stop_by - self._cl._loop.time()
        return max(0.0, min(self._every, left / 2))

    async def _run(self) -> None:
        cl = self._cl
        loop = cl._loop
        delay = self._next_renewal()
        while True:
            by = self.stop_by
            at = min(loop.time() + delay, by)
            if cl._closed or not await cl._sleep(at - loop.time(), by + 1):
                self._lose(errors.LockLost("lockd: lock lost: the client was closed", errors.Closed("lockd: client closed")))
                return
            if loop.time() >= by:
                self._lose(errors.LockLost("lockd: lock lost: no renewal succeeded before the holder's stop time"))
                return
            err: BaseException
            try:
                async with asyncio.timeout_at(by):
                    nl = await cl.renew(self._lock, self._lease)
            except errors.NotHeld as e:
                self._lose(errors.LockLost("lockd: lock lost: a renewal was answered N (not held)", e))
                return
            except errors.Closed as e:
                self._lose(errors.LockLost("lockd: lock lost: the client was closed", e))
                return
            except (errors.LockdError, TimeoutError) as e:
                err = e
            else:
                self._lock = nl
                delay = self._next_renewal()
                continue
            if loop.time() >= by:
                self._lose(errors.LockLost("lockd: lock lost: no renewal succeeded before the holder's stop time", err))
                return
            if self._on_renew_error is not None:
                self._on_renew_error(err)
            delay = min(self._retry, by - loop.time())


class LockContext:
    """What :meth:`Client.lock` returns: ``async with`` it to hold a lock for
    a block (see there)."""

    def __init__(self, cl: Client, key: str, wait: float, lease: float | None, margin: float) -> None:
        self._cl = cl
        self._key = key
        self._wait = wait
        self._lease = lease
        self._margin = margin
        self._held: HeldLock | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._cancelled = False
        self._exiting = False

    async def __aenter__(self) -> HeldLock:
        cl = self._cl
        lock = await cl.acquire(self._key, self._wait, self._lease)
        try:
            held = await cl.keep_alive(lock, lease=self._lease, margin=self._margin)
        except BaseException:
            await asyncio.shield(cl._spawn(_quiet(cl.release(lock))))
            raise
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._held = held
        held.add_lost_callback(self._on_lost)
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
        held = self._held
        assert held is not None and self._task is not None
        converted = False
        if self._cancelled:
            if self._task.uncancel() <= self._cancelling and et is asyncio.CancelledError:
                converted = True
        lost = await held.stop()
        cl = self._cl
        rerr: BaseException | None = None
        if not cl.closed:
            try:
                await asyncio.shield(cl._spawn(cl.release(held.lock)))
            except errors.LockdError as e:
                rerr = e
        if converted:
            assert lost is not None
            raise lost from ev
        if et is not None:
            return
        if lost is not None:
            raise lost
        if isinstance(rerr, errors.NotHeld):
            raise errors.LockLost("lockd: lock lost: the release was answered N (not held)", rerr)
        if rerr is not None:
            raise rerr


async def _quiet(coro: Coroutine[object, object, None]) -> None:
    try:
        await coro
    except errors.LockdError:
        pass

