"""The client's connections: :class:`Pool`.

A pool keeps one persistent connection per slot (one slot per address, two
for a single address), dials each in the background and again every
``reconnect_interval`` after it ends, picks a connection for each request
(the preferred address an ``M`` named, else round-robin by batch), follows
``M`` answers, and runs one request's round trip: send, wait for the answer,
and resend on another connection only while the request is definitely
unsent. Everything runs on the client's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from typing import Callable

from . import errors
from ._conn import S9_OPS, Conn
from ._request import (
    RES_ABANDONED,
    RES_ANSWER,
    RES_DEADLINE,
    RES_EXPIRED,
    RES_REFUSED,
    RES_REJECTED,
    RES_UNSENT,
    RES_UNSUPPORTED,
    Req,
)
from ._settings import Settings
from ._types import fresh, split_addr
from .proto import OP_WATCH, op_name

log = logging.getLogger("lockd")

MAX_REDIRECT_ADDRS = 8
"""Addresses beyond the configured ones that a client keeps connections to
because an ``M`` answer named them; the one least recently named is dropped
first (no new request goes there; its connections close once idle)."""

_RETIRE_POLL = 0.05

# Outcomes of one round trip, the caller's view of one request.
OUT_ANSWER = 0
OUT_NOT_SENT = 1  # the send deadline passed before it was sent
OUT_NO_CONN = 2  # the send deadline passed with no connection available
OUT_LOST = 3  # the connection died with the request possibly sent: req.rerr
OUT_ABANDONED = 4  # the transport deadline passed with the request possibly sent
OUT_CLOSED = 5  # the client was closed before it was sent
OUT_REFUSED = 6  # the server refused the identity: req.rerr
OUT_DEADLINE = 7  # the caller's deadline passed before the answer
OUT_REJECTED = 8  # written, but the server refused the connection unread: req.rerr
OUT_UNSUPPORTED = 9  # the server does not speak §9 (E 1 to it, now or before): req.rerr
OUT_NO_ROOM = 10  # a watch, and no connection where it must go has room for one

# What _try_send did.
_SENT = 0
_NONE = 1  # no connection now
_FULL = 2  # a watch, and no room for it
_UNSUPPORTED = 3  # a §9 request for an address that answered E 1 to one: req.rerr


def _definitive_tls_refusal(err: BaseException | None) -> bool:
    """Whether ``err`` is a TLS failure that a redial will not change: the
    server's certificate does not verify, the server refused ours (an alert),
    or a plaintext client met a TLS port that said so."""
    if isinstance(err, ssl.SSLCertVerificationError):
        return True
    if isinstance(err, ssl.SSLError):
        return "ALERT" in str(err.reason or "").upper()
    return isinstance(err, errors.Rejected) and "TLS" in err.reason


class Slot:
    """One persistent connection's place: its address and current connection
    (None while down). A task per slot dials, watches and redials it."""

    __slots__ = ("addr", "conn", "down", "err", "redial", "redirect", "named", "retired", "task")

    def __init__(self, addr: str, redirect: bool, loop: asyncio.AbstractEventLoop) -> None:
        self.addr = addr
        self.conn: Conn | None = None
        self.down = False  # its last dial failed or its connection ended, and it is not up again
        self.err: BaseException | None = None  # why it is down
        self.redial = asyncio.Event()  # an M named addr: cut the pause before the next dial short
        self.redirect = redirect  # opened for an address an M named, not in the configured list
        self.named = 0.0  # the latest M naming addr
        self.retired: asyncio.Future[None] = loop.create_future()  # done when evicted
        self.task: asyncio.Task[None] | None = None


class Pool:
    """The connections of one client and the round trip of a request over
    them (see the module doc). It is the :class:`~lockd._conn.Owner` of
    every connection it opens."""

    def __init__(self, st: Settings, loop: asyncio.AbstractEventLoop, rand: random.Random) -> None:
        self.st = st
        self.loop = loop
        self.rand = rand
        self.closed = False
        self.slots: list[Slot] = []
        self.preferred = ""  # the address an M pointed to
        self.rr = 0
        self.established = False  # a server's answer has been read on some connection
        self.conn_err: BaseException | None = None  # why the last dial failed or connection ended
        self.conn_err_addr = ""
        self.auth_err: BaseException | None = None  # the last refused hello, until one succeeds
        self.changed = asyncio.Event()
        self.closing = asyncio.Event()
        self.late_grant_fn: Callable[[str, int], None] = lambda key, token: None
        # Addresses that answered E 1 to a §9 request: §9 requests for them
        # fail at once (each would cost a connection), until a connection
        # to them ends otherwise (a restart, perhaps an upgrade).
        self.no_s9: dict[str, errors.Unsupported] = {}
        for _ in range(st.conns_per_addr):
            for a in st.addrs:
                self._add_slot(a, False)

    def _add_slot(self, addr: str, redirect: bool) -> Slot:
        s = Slot(addr, redirect, self.loop)
        s.named = self.loop.time()
        self.slots.append(s)
        s.task = self.loop.create_task(self._run_slot(s))
        return s

    async def close(self) -> None:
        """Close every connection and end every slot's task."""
        if self.closed:
            return
        self.closed = True
        self.closing.set()
        self.signal_changed()
        tasks: list[asyncio.Task[None]] = []
        for s in self.slots:
            if s.task is not None:
                s.task.cancel()
                tasks.append(s.task)
            if s.conn is not None:
                s.conn.fail(errors.Closed("lockd: client closed"))
        await asyncio.gather(*tasks, return_exceptions=True)

    def live(self) -> int:
        """How many connections are up now."""
        return sum(1 for s in self.slots if s.conn is not None and not s.conn.dead)

    def identity(self) -> str:
        """The identity a server last confirmed with ``H`` ("" if none yet)."""
        for s in self.slots:
            c = s.conn
            if c is not None and not c.dead and c.identity:
                return c.identity
        return ""

    # The connections' reports (lockd._conn.Owner).

    def conn_heard(self, conn: Conn) -> None:
        self.established = True

    def conn_welcomed(self, conn: Conn) -> None:
        self.auth_err = None

    def conn_refused(self, conn: Conn, err: BaseException) -> None:
        self.auth_err = err
        self.conn_err = err
        self.conn_err_addr = conn.addr

    def conn_wrote(self, conn: Conn) -> None:
        self.rr += 1  # round-robin by batch: the next requests go to the next connection

    def conn_ended(self, conn: Conn) -> None:
        if self.closed:
            return
        if not conn.unsupported_op and self.no_s9.pop(conn.addr, None) is not None:
            log.info("lockd: a connection to %s ended: §9 requests will be tried there again", conn.addr)
        # Set before the calls woken by the failure read it.
        self.conn_err = conn.end_cause()
        self.conn_err_addr = conn.addr
        self.signal_changed()

    def late_grant(self, key: str, token: int) -> None:
        self.late_grant_fn(key, token)

    def unsupported(self, conn: Conn, op: int, msg: str) -> None:
        if conn.addr not in self.no_s9:
            log.warning(
                "lockd: %s does not support %s (PROTOCOL.md §9: it answered E 1 and closed the connection); "
                "§9 requests to it fail until a connection to it ends otherwise",
                conn.addr,
                op_name(op),
            )
        self.no_s9[conn.addr] = errors.Unsupported(conn.addr, op_name(op), msg)

    # Slots.

    async def _run_slot(self, s: Slot) -> None:
        """Keep one persistent connection: dial, serve until it dies, wait
        ``reconnect_interval`` (or until an M names the address), dial again."""
        loop = self.loop
        while True:
            err: BaseException
            try:
                conn = await self._dial(s.addr)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if isinstance(e, (errors.LockdError, ssl.SSLError)):
                    err = e
                elif isinstance(e, TimeoutError):
                    err = ConnectionError(f"dial {s.addr}: no answer within the dial timeout ({self.st.dial_timeout:g} s)")
                else:
                    err = ConnectionError(f"dial {s.addr}: {e}")
                    err.__cause__ = e
                if self.closed or s.retired.done():
                    return
                # Once per outage, not at every redial.
                log.log(logging.DEBUG if s.down else logging.WARNING, "lockd: cannot connect to %s: %s", s.addr, err)
                self.conn_err = err
                self.conn_err_addr = s.addr
            else:
                s.conn = conn
                s.down = False
                s.err = None
                log.debug("lockd: connected to %s", s.addr)
                if self.st.hello is None:
                    # No hello to confirm an identity: an E 5 seen before
                    # no longer says anything about this connection.
                    self.auth_err = None
                self.signal_changed()
                try:
                    await asyncio.wait([conn.gone, s.retired], return_when=asyncio.FIRST_COMPLETED)
                    if s.retired.done() and not conn.dead:
                        while not conn.dead and not conn.idle():
                            await asyncio.wait([conn.gone], timeout=_RETIRE_POLL)
                        conn.fail(errors.LockdError("connection to an address no M has named lately, closed once idle"))
                finally:
                    if self.closed:
                        conn.fail(errors.Closed("lockd: client closed"))
                s.conn = None
                err = conn.end_cause()
                if not self.closed and not s.retired.done():
                    if conn.refused_at_setup:
                        log.warning("lockd: %s refused the connection: %s", s.addr, err)
                    else:
                        log.warning("lockd: %s; dialling again in %g s", err, self.st.reconnect_interval)
            if self.closed or s.retired.done():
                return
            s.err = err
            s.down = True
            self.signal_changed()
            s.redial.clear()
            try:
                async with asyncio.timeout_at(loop.time() + self.st.reconnect_interval):
                    await s.redial.wait()
            except TimeoutError:
                pass
            if s.retired.done():
                return

    async def _dial(self, addr: str) -> Conn:
        host, port = split_addr(addr)
        st = self.st
        nonce = self.rand.getrandbits(64)
        async with asyncio.timeout(st.dial_timeout):
            _, conn = await self.loop.create_connection(
                lambda: Conn(self, self.loop, addr, st.hello, nonce, st.transport_timeout),
                host,
                port,
                ssl=st.ssl,
                server_hostname=(st.server_hostname or host) if st.ssl is not None else None,
            )
            if st.hello is None:
                # Up once the server answered the first ping: a server that
                # refuses the connection has then been sent no request.
                try:
                    await conn.ready
                except BaseException:
                    conn.fail(errors.LockdError("dial abandoned"))
                    raise
        return conn

    def signal_changed(self) -> None:
        """Wake the calls waiting for a connection."""
        old = self.changed
        self.changed = asyncio.Event()
        old.set()

    def _unreachable(self) -> bool:
        """No server was reached yet and every slot has failed once."""
        if self.established:
            return False
        return all(s.down for s in self.slots)

    def _tls_refused(self) -> bool:
        """Every slot is down because of a TLS failure a redial will not
        change: waiting for a connection is pointless."""
        return bool(self.slots) and all(s.down and _definitive_tls_refusal(s.err) for s in self.slots)

    def no_conn_err(self, cause: BaseException | None = None, addr: str = "") -> errors.NoConnection:
        """:class:`NoConnection` with ``cause`` (at ``addr``), or the reason
        of the last failure."""
        if cause is None:
            cause, addr = self.conn_err, self.conn_err_addr
        if cause is None:
            return errors.NoConnection()
        if isinstance(cause, ssl.SSLError):
            return errors.NoConnection(f"lockd: no connection to lockd: TLS with {addr} failed", fresh(cause))
        return errors.NoConnection(cause=fresh(cause))

    def _pick(self, addr: str, avoid: str) -> Conn | None:
        """A live connection: to ``addr`` if set (None if none is up), else to
        the preferred address if one is up, else the next live one in
        round-robin order, passing over ``avoid`` while there is another."""
        if addr:
            return self._pick_addr(addr)
        if self.preferred and self.preferred != avoid:
            c = self._pick_addr(self.preferred)
            if c is not None:
                return c
        slots = self.slots
        n = len(slots)
        i0 = self.rr
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

    def _pick_addr(self, addr: str, room: bool = False) -> Conn | None:
        """A live connection to ``addr`` (with ``room``: one with room for a
        watch)."""
        slots = self.slots
        n = len(slots)
        i0 = self.rr
        for i in range(n):
            s = slots[(i0 + i) % n]
            if s.addr != addr:
                continue
            c = s.conn
            if c is not None and not c.dead and (not room or c.watch_room()):
                return c
        return None

    def _follow(self, addr: str) -> None:
        """Make ``addr`` (named by an M) the preferred address, opening
        connections to it if it has none; beyond MAX_REDIRECT_ADDRS such
        addresses, the least recently named is evicted."""
        if self.closed:
            return
        if self.preferred != addr:
            log.info("lockd: %s is the active member now (an M named it): sending there", addr)
        self.preferred = addr
        now = self.loop.time()
        known = False
        for s in self.slots:
            if s.addr == addr:
                known = True
                if s.redirect:
                    s.named = now
        if known:
            return
        redirects: dict[str, float] = {}
        for s in self.slots:
            if s.redirect:
                redirects[s.addr] = s.named
        if len(redirects) >= MAX_REDIRECT_ADDRS:
            victim = min(redirects, key=lambda a: redirects[a])
            keep = []
            for s in self.slots:
                if s.addr == victim:
                    if not s.retired.done():
                        s.retired.set_result(None)
                    s.redial.set()
                    continue
                keep.append(s)
            self.slots = keep
        for _ in range(self.st.conns_per_addr):
            self._add_slot(addr, True)

    def _unreachable_addr(self, addr: str) -> bool:
        """No request can go to ``addr`` now (no slot, or every slot down);
        its down slots are told to dial again at once: an M named it."""
        reachable = False
        for s in self.slots:
            if s.addr != addr:
                continue
            if not s.down:
                reachable = True
                continue
            s.redial.set()
        return not reachable

    def unprefer(self, addr: str) -> None:
        """Stop sending to ``addr`` first (it knows no active, or did not
        answer)."""
        if self.preferred == addr:
            log.info("lockd: %s stopped answering as the active member: asking the others", addr)
            self.preferred = ""

    def follow_moved(self, r: Req) -> bool:
        """Act on an M: an address becomes preferred and the request goes
        there next (True: resend at once). An empty address (or one that
        cannot be used, or the one the request just gave up on) drops the
        preference for the node that said so, and after a pause (False) the
        request goes to another node."""
        addr = r.rtail
        if addr:
            try:
                split_addr(addr)
            except errors.InvalidArgument:
                addr = ""
        if addr and addr == r.avoid and not r.held_back:
            # It names the member that did not answer this request in time
            # (frozen, say): the one that answered may not know yet. Pause
            # and ask again; the next M naming it is followed (it may only
            # have been slow).
            r.held_back = True
            return False
        r.held_back = False
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
        self.unprefer(r.from_addr)
        return False

    # The round trip.

    def _try_send(self, r: Req) -> int:
        """Attach ``r`` to a live connection, if one is available now. A §9
        request is not sent to an address known not to support §9; a watch
        goes to a connection to the address picked that has room for it."""
        s9 = r.op in S9_OPS
        while True:
            c = self._pick(r.moved, r.avoid)
            if c is None:
                if r.moved and self._unreachable_addr(r.moved):
                    r.avoid, r.moved = r.moved, ""
                    continue
                return _NONE
            if s9:
                e = self.no_s9.get(c.addr)
                if e is not None:
                    r.rerr = e
                    return _UNSUPPORTED
                if r.op == OP_WATCH and not c.watch_room():
                    c2 = self._pick_addr(c.addr, room=True)
                    if c2 is None:
                        return _FULL
                    c = c2
            if c.enqueue(r):
                return _SENT

    async def _wait_conn(self, r: Req) -> int:
        """Wait until a connection may be available: -1, or an outcome that
        ends the attempt."""
        ev = self.changed
        sent = self._try_send(r)
        if sent == _SENT:
            return -1
        if sent == _FULL:
            return OUT_NO_ROOM
        if sent == _UNSUPPORTED:
            return OUT_UNSUPPORTED
        if self.closed:
            return OUT_CLOSED
        if self.auth_err is not None:
            r.rerr = self.auth_err
            return OUT_REFUSED
        if self.loop.time() >= r.send_by or (self.st.fail_fast and self._unreachable()) or self._tls_refused():
            return OUT_NO_CONN
        try:
            async with asyncio.timeout_at(r.send_by):
                await ev.wait()
        except TimeoutError:
            return OUT_NO_CONN
        return -1

    async def round_trip(self, r: Req) -> int:
        """Send ``r`` and wait for its answer, resending on another connection
        only while it is definitely unsent. A
        cancellation of the caller takes the request back (see
        :meth:`Conn.cancel_attempt`) and propagates."""
        while True:
            if r.conn is None:
                if self.closed:
                    return OUT_CLOSED
                if self._try_send(r) != _SENT:
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
                return OUT_ANSWER
            if res == RES_UNSENT:
                continue
            if res == RES_EXPIRED:
                return OUT_NOT_SENT
            if res == RES_DEADLINE:
                return OUT_DEADLINE
            if res == RES_ABANDONED:
                return OUT_ABANDONED
            if res == RES_REFUSED:
                return OUT_REFUSED
            if res == RES_REJECTED:
                return OUT_REJECTED
            if res == RES_UNSUPPORTED:
                return OUT_UNSUPPORTED
            return OUT_LOST

    async def sleep(self, d: float, limit: float) -> bool:
        """Pause ``d``; False if the client closed or ``limit`` came first
        (then it returns at ``limit``: a call does not give up early)."""
        at = self.loop.time() + d
        ok = at < limit
        if not ok:
            at = limit
        if self.closed:
            return False
        try:
            async with asyncio.timeout_at(at):
                await self.closing.wait()
        except TimeoutError:
            return ok
        return False
