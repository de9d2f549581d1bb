"""One connection of the client: the write path, the reader, the pending table.

Everything here runs on the client's event loop; nothing is thread-safe and
nothing needs to be. A connection knows nothing of the client: it reports
what its pool must know through the :class:`Owner` interface.

The write path: every request queued in one turn of the loop leaves in one
``transport.write``, by a callback scheduled with ``call_soon`` when the first
request of the batch is queued. A request past its send deadline at that
moment is dropped unsent. The wire wait is computed there.

The deadlines of a sent request (see :mod:`lockd._request`):

- **The caller's deadline** (an acquire with a wait): the caller is told
  :class:`~lockd.Timeout` at that instant and the request leaves a stand-in;
  the connection stays. A ``T`` that comes later is dropped; a grant is
  released at once (:meth:`Owner.late_grant`). A renewal's attempt timeout
  works the same way: the caller tries another member, the connection
  stays.
- **The transport deadline** (send + wire wait + allowance for an acquire
  with a wait; send + the transport timeout otherwise): a server that works
  has answered by then. If it has not, the connection is taken to be broken
  and closed — for an acquire always, since the server releases a grant it
  has not yet written when its connection closes; for other requests once
  they have waited at least half their transport timeout (an attempt cut
  short by its call's overall limit says nothing about the connection).
- **Cancellation** by the caller: a queued request is taken back unsent; a
  sent one leaves a stand-in, and the connection stays.

The first frame of every connection is one the server answers at once: the
hello when the client has an identity and a secret, else a ping sent for
this alone (its pong is matched to nothing; :attr:`Conn.ready` is done when
it comes). Without a hello, the pool offers a connection to requests only
once that first answer came, so a connection the server refuses — lockd at
``--max-conns`` closes it unread, a TLS port closes a plaintext client or
answers it one ``E`` 1 saying it speaks TLS, a TLS alert refuses a missing
client certificate — never carried a request: it is a failed dial, and its
cause says why. With a hello, requests are pipelined behind it (PROTOCOL.md
§8.6); lockd answers the hello before it executes anything behind it, so a
connection the server closes before any byte came executed nothing either.

When a connection ends, its queued requests are definitely unsent and go
elsewhere; its sent ones are lost (possibly executed), or, when the server
refused the connection as above, rejected (not executed; the refusal is
their error). Neither is resent: a byte of them was written.

Watches (PROTOCOL.md §9.4): a watch request carries a :class:`WatchReg`;
when the server answers ``W``, the reader registers it on this connection
at once — before any later frame is read, so an ``L`` right behind the
``W`` finds it — and the one ``L`` for it ends it with its reason. A
connection that ends ends every registration on it with reason 4 (it can no
longer tell) and its cause. The connection counts what the server counts
against its bound of watches (registrations, and watch requests on their
way), to send a watch only where there is room: none is known until an
``E`` 8, which sets the bound to the registrations the connection holds, so
it takes no watch until one of them ends.

A server without §9 answers a §9 request ``E`` 1 and closes: that request
fails with :class:`~lockd.errors.Unsupported`; the requests written after it
were never read (they go elsewhere, as unsent), and those written before it
are lost with a cause that says why.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Protocol

from . import errors
from ._request import (
    DONE,
    IDLE,
    QUEUED,
    RES_ABANDONED,
    RES_ANSWER,
    RES_DEADLINE,
    RES_EXPIRED,
    RES_LOST,
    RES_NONE,
    RES_REFUSED,
    RES_REJECTED,
    RES_UNSENT,
    RES_UNSUPPORTED,
    SENT,
    Req,
    WatchReg,
)
from .proto import (
    CODE_BAD_FRAME,
    CODE_LIMIT_REACHED,
    CODE_UNAUTHENTICATED,
    OP_ACQUIRE,
    OP_BUSY,
    OP_ERROR,
    OP_HELLO,
    OP_INSPECT,
    OP_LOST,
    OP_MOVED,
    OP_NOT_HELD,
    OP_PING,
    OP_RELEASE,
    OP_RENEW,
    OP_SHARED,
    OP_TIMEOUT,
    OP_VALIDATE,
    OP_WATCH,
    REASON_CANNOT_TELL,
    FrameError,
    _extra,
    _scan_response,
    encode_hello,
    encode_ping,
    op_name,
)

S9_OPS = frozenset((OP_SHARED, OP_VALIDATE, OP_WATCH, OP_INSPECT))
"""The request ops of PROTOCOL.md §9: a server without §9 answers them E 1."""

WATCH_BOUND_MAX = 1 << 30
"""The largest --max-watches-per-conn lockd takes: the bound a connection
assumes until an E 8 tells it the server's."""


class Owner(Protocol):
    """What a connection tells the pool that owns it (all on the loop)."""

    def conn_heard(self, conn: Conn) -> None:
        """The first bytes came from the server."""

    def conn_welcomed(self, conn: Conn) -> None:
        """The server accepted the connection's hello."""

    def conn_refused(self, conn: Conn, err: BaseException) -> None:
        """The server refused the connection's identity (E 5)."""

    def conn_wrote(self, conn: Conn) -> None:
        """A batch was written: the next one goes to the next connection."""

    def conn_ended(self, conn: Conn) -> None:
        """The connection died; :meth:`Conn.end_cause` says why."""

    def late_grant(self, key: str, token: int) -> None:
        """A grant came for a request whose caller stopped waiting: release it."""

    def unsupported(self, conn: Conn, op: int, msg: str) -> None:
        """The server answered E 1 to a §9 request of op ``op`` (it does not
        speak §9) and is closing the connection."""


log = logging.getLogger("lockd")

# The pending table an answer's request waits in, by request op: an acquire
# shared is answered like an acquire (A, T, B by owner).
_TABLE = bytes(OP_ACQUIRE if i == OP_SHARED else i for i in range(256))
# How the reader handles an answer, by answer op (one lookup, the common
# answers first): the pending table is the op's own (A, R, K, P, W), the
# acquire table (T, B), the one of the op the answer names (N; M, whose
# tail is kept), or the op's own with the §9 fields kept (V, I); H and L
# are no request's answer; E is looked at first.
_K_OWN, _K_ACQ, _K_REQ_OP, _K_TAIL, _K_LOST, _K_HELLO, _K_QUERY, _K_ERROR = range(8)
_KIND = bytes(
    {
        OP_TIMEOUT: _K_ACQ,
        OP_BUSY: _K_ACQ,
        OP_NOT_HELD: _K_REQ_OP,
        OP_MOVED: _K_TAIL,
        OP_LOST: _K_LOST,
        OP_HELLO: _K_HELLO,
        OP_VALIDATE: _K_QUERY,
        OP_INSPECT: _K_QUERY,
        OP_ERROR: _K_ERROR,
    }.get(i, _K_OWN)
    for i in range(256)
)


class Conn(asyncio.Protocol):
    """One TCP (or TLS) connection to one address."""

    def __init__(
        self,
        owner: Owner,
        loop: asyncio.AbstractEventLoop,
        addr: str,
        hello: bytes | None,
        nonce: int,
        transport_timeout: float,
    ) -> None:
        self.owner = owner
        self.loop = loop
        self.addr = addr
        self.transport_timeout = transport_timeout
        self.transport: asyncio.Transport | None = None
        self.queue: list[Req] = []
        self.pend: dict[int, dict[int, Req]] = {
            op: {} for op in (OP_ACQUIRE, OP_RELEASE, OP_RENEW, OP_PING, OP_VALIDATE, OP_WATCH, OP_INSPECT)
        }
        self.seq = 0  # frames written
        self.watches: dict[int, list[WatchReg]] = {}  # registered watches by token, oldest first
        self.nreg = 0  # registered watches (those detached included): the server counts them
        self.wflight = 0  # watch requests written and not answered yet
        # The server's bound of watches (--max-watches-per-conn) as far as
        # this client knows: none until an E 8 said how many it holds.
        self.watch_bound = WATCH_BOUND_MAX
        self.unsupported_op = 0  # the §9 op the server answered E 1 (it does not speak §9)
        self.dead = False
        self.flushing = False  # a flush is scheduled
        self.rbuf = b""
        self.gone: asyncio.Future[None] = loop.create_future()
        self.ready: asyncio.Future[None] = loop.create_future()  # the first answer came (or the cause it never will)
        self.cause: BaseException | None = None
        self.refused_at_setup = False  # the server refused the connection before reading from it
        self.heard = False  # a byte came from the server
        self.answered = False  # a whole frame came from the server
        self.hello = hello  # the H frame's tail, None without an identity and secret
        self.hello_nonce = nonce  # of the first frame: the hello or the ping
        self.hello_pending = False
        self.identity = ""  # the identity the server's H named
        self.write_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Store the transport and send the first frame (the hello, or a
        ping) before any request."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=1 << 20)
        if self.hello is not None:
            self.hello_pending = True
            transport.write(encode_hello(self.hello_nonce, self.hello))
        else:
            transport.write(encode_ping(self.hello_nonce))

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every request on the connection. A connection the server
        refused before answering anything executed nothing: its requests
        are rejected, not lost."""
        if self.dead:
            return
        if not self.heard:
            self.fail(exc if isinstance(exc, ssl.SSLError) else errors.Rejected(self.addr), setup=True)
            return
        self.fail(exc if exc is not None else ConnectionResetError("the server closed the connection"))

    def pause_writing(self) -> None:
        """The server stopped reading: fail after a whole transport timeout."""
        if self.write_timer is None:
            self.write_timer = self.loop.call_later(self.transport_timeout, self._write_blocked)

    def resume_writing(self) -> None:
        """The server reads again."""
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def _write_blocked(self) -> None:
        self.write_timer = None
        self.fail(TimeoutError(f"the server stopped reading for the transport timeout ({self.transport_timeout:g} s)"))

    @staticmethod
    def table_of(op: int) -> int:
        """The pending table of requests of ``op``."""
        return _TABLE[op]

    def watch_room(self) -> bool:
        """Whether one more watch fits under the bound of watches."""
        n = self.nreg + self.wflight
        if n >= self.watch_bound:
            return False
        for q in self.queue:
            if q.op == OP_WATCH:
                n += 1
        return n < self.watch_bound

    # The write path.

    def enqueue(self, r: Req) -> bool:
        """Queue ``r`` for the next batch; False if the connection is dead."""
        if self.dead:
            return False
        r.conn = self
        r.state = QUEUED
        r.res = RES_NONE
        r.rerr = None
        r.fut = self.loop.create_future()
        self.queue.append(r)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        """Write every queued request in one write; drop those past their
        send deadline unsent."""
        self.flushing = False
        if self.dead or not self.queue:
            return
        q = self.queue
        self.queue = []
        self.owner.conn_wrote(self)
        loop = self.loop
        now = loop.time()
        parts = []
        pend = self.pend
        call_at = loop.call_at
        for r in q:
            if now >= r.send_by:
                r.finish(RES_EXPIRED)
                continue
            parts.append(r.encode(now))
            r.state = SENT
            r.sent_at = now
            self.seq += 1
            r.seq = self.seq
            if r.op == OP_WATCH:
                self.wflight += 1
            self._add_pending(pend[_TABLE[r.op]], r)
            by = r.answer_by()
            r.timer = call_at(by, self._transport_deadline, r)
            give_up = r.give_up_at()
            if give_up and give_up < by:
                r.ctimer = call_at(give_up, self._caller_deadline, r)
        if parts:
            assert self.transport is not None
            self.transport.write(b"".join(parts))

    @staticmethod
    def _add_pending(table: dict[int, Req], r: Req) -> None:
        head = table.get(r.id)
        if head is None:
            table[r.id] = r
            return
        while head.next is not None:
            head = head.next
        head.next = r

    def _caller_deadline(self, r: Req) -> None:
        """The caller stops waiting before the answer (its deadline, or a
        renewal's attempt timeout): it is told so; the request's stand-in
        takes whatever answer still comes, until the transport deadline."""
        r.ctimer = None
        if r.conn is not self or r.state != SENT:
            return
        self._stand_in(r)
        r.finish(RES_DEADLINE)

    def _transport_deadline(self, r: Req) -> None:
        """No answer by the transport deadline of ``r`` (a request, or a
        stand-in) with it possibly sent: the server is not answering."""
        r.timer = None
        if r.state != SENT:
            return
        if r.tomb:
            self._unlink(r)
            if r.op == OP_WATCH:
                self.wflight -= 1  # taken to be unanswered
        elif r.conn is self:
            self._stand_in(r, timer=False)
            r.finish(RES_ABANDONED)
        else:
            return
        waited = self.loop.time() - r.sent_at
        if r.acq or waited >= r.timeout / 2:
            self.fail(
                errors.LockdError(
                    f"no answer from {self.addr} to a request {waited:.2f} s after it was sent: "
                    "the connection is taken to be broken and was closed"
                )
            )

    def _unlink(self, r: Req) -> None:
        """Take ``r`` out of its chain in the pending table."""
        table = self.pend[_TABLE[r.op]]
        head = table.get(r.id)
        if head is r:
            if r.next is None:
                del table[r.id]
            else:
                table[r.id] = r.next
        else:
            while head is not None and head.next is not r:
                head = head.next
            if head is not None:
                head.next = r.next
        r.next = None
        r.state = DONE

    def _stand_in(self, r: Req, timer: bool = True) -> None:
        """Put a stand-in in ``r``'s place in its chain (see
        :mod:`lockd._request`), with ``r``'s transport deadline if
        ``timer``."""
        table = self.pend[_TABLE[r.op]]
        t = r.stand_in()
        head = table.get(r.id)
        if head is r:
            t.next = r.next
            table[r.id] = t
        else:
            while head is not None and head.next is not r:
                head = head.next
            if head is not None:
                t.next = r.next
                head.next = t
        r.next = None
        r.stop_timers()
        if timer:
            t.timer = self.loop.call_at(t.answer_by(), self._transport_deadline, t)

    def cancel_attempt(self, r: Req) -> None:
        """The waiter of ``r`` was cancelled: take ``r`` back. A queued
        request is removed (never sent); a sent one leaves a stand-in, and
        the connection stays; a grant that reached ``r`` before its waiter
        could take it is released again; a watch it registered calls
        nothing (it still counts until its ``L``)."""
        st = r.state
        if st == QUEUED:
            try:
                self.queue.remove(r)
            except ValueError:
                pass
        elif st == SENT:
            self._stand_in(r)
        elif st == DONE and r.res == RES_ANSWER and r.acq and r.rop == OP_ACQUIRE:
            self.owner.late_grant(r.key, r.rtoken)
        if r.reg is not None:
            r.reg.detach()
        r.stop_timers()
        r.state = IDLE
        r.conn = None

    # The reader.

    def data_received(self, data: bytes) -> None:
        """Parse every complete answer and hand it to its request."""
        if self.rbuf:
            data = self.rbuf + data
            self.rbuf = b""
        if not self.heard:
            self.heard = True
            self.owner.conn_heard(self)
        pos = 0
        n = len(data)
        pend = self.pend
        try:
            while pos < n:
                f = _scan_response(data, pos)
                if f is None:
                    break
                end, op, req_op, ident, token, code, ts, te = f
                start = pos
                pos = end
                first = not self.answered
                self.answered = True
                kind = _KIND[op]
                if kind == _K_OWN:
                    t = op
                elif kind == _K_ACQ:
                    t = OP_ACQUIRE
                elif kind == _K_REQ_OP or kind == _K_TAIL:
                    t = _TABLE[req_op]
                elif kind == _K_LOST:
                    self._lost(ident, data[start + 9])
                    continue
                elif kind == _K_HELLO:
                    if self.hello_pending and ident == self.hello_nonce:
                        self.hello_pending = False
                        self.identity = data[ts:te].decode("utf-8", "replace")
                        self.owner.conn_welcomed(self)
                    continue
                elif kind == _K_QUERY:
                    t = op
                else:  # _K_ERROR
                    msg = data[ts:te].decode("utf-8", "replace")
                    if code == CODE_BAD_FRAME and req_op in S9_OPS:
                        self._unsupported(req_op, ident, msg)
                        return
                    if code == CODE_BAD_FRAME and first and "tls" in msg.lower():
                        # A TLS port's only answer to a plaintext client:
                        # it read no request.
                        self.fail(errors.Rejected(self.addr, f"the server's port speaks TLS ({msg})"), setup=True)
                        return
                    if req_op == OP_HELLO:
                        self._hello_refused(code, msg)
                        return
                    if code == CODE_BAD_FRAME:
                        self.fail(errors.LockdError(f"{self.addr} reported a bad frame (E 1) and closed: {msg}"))
                        return
                    if code == CODE_UNAUTHENTICATED:
                        self._refuse(
                            errors.Unauthenticated(
                                f"lockd: {self.addr} requires authentication: {msg}"
                                if self.hello is None
                                else f"lockd: {self.addr} refused the request as unauthenticated: {msg}",
                                msg,
                            )
                        )
                        return
                    t = _TABLE[req_op]
                table = pend.get(t)
                if table is None:
                    continue
                r = table.pop(ident, None)
                if r is None:
                    continue
                nx = r.next
                if nx is not None:
                    table[ident] = nx
                    r.next = None
                if t == OP_WATCH:
                    self.wflight -= 1
                    if op == OP_WATCH:
                        # Registered now: an L right behind finds it.
                        self._register(ident, r.reg if not r.tomb and r.reg is not None else WatchReg(None))
                    elif op == OP_ERROR and code == CODE_LIMIT_REACHED:
                        self.watch_bound = min(self.watch_bound, self.nreg)
                if r.tomb:
                    r.stop_timers()
                    r.state = DONE
                    if op == OP_ACQUIRE:
                        self.owner.late_grant(r.key, token)
                    continue
                r.rop = op
                r.rtoken = token
                r.rcode = code
                if kind == _K_TAIL or kind == _K_ERROR:
                    r.rtail = data[ts:te].decode("utf-8", "replace")
                elif kind == _K_QUERY:
                    _reason, remaining, holders, limit, waiters = _extra(data, start, op)
                    r.rremain = remaining
                    if op == OP_INSPECT:
                        r.rinsp = (holders, limit, waiters, remaining)
                r.finish(RES_ANSWER)
        except FrameError as e:
            self.fail(errors.LockdError(f"{self.addr} sent a bad frame: {e}"))
            return
        if pos < n:
            self.rbuf = data[pos:]
        if self.answered and not self.ready.done():
            self.ready.set_result(None)

    def _register(self, token: int, reg: WatchReg) -> None:
        self.nreg += 1
        regs = self.watches.get(token)
        if regs is None:
            self.watches[token] = [reg]
        else:
            regs.append(reg)

    def _lost(self, token: int, reason: int) -> None:
        """An L: the oldest registration for ``token`` ends with ``reason``."""
        regs = self.watches.get(token)
        if not regs:
            log.debug("lockd: %s sent L for token %d, which no watch here waits for", self.addr, token)
            return
        reg = regs.pop(0)
        if not regs:
            del self.watches[token]
        self.nreg -= 1
        reg.end(reason, None)

    def _unsupported(self, req_op: int, ident: int, msg: str) -> None:
        """E 1 to a §9 request: the server does not speak §9 and closes. The
        first such request written fails with Unsupported; what was written
        after it was not read (unsent: it goes elsewhere); what was written
        before it is lost, with this as the cause."""
        bad: Req | None = None
        for head in self.pend[_TABLE[req_op]].values():
            r: Req | None = head
            while r is not None:
                if r.op == req_op and (ident == 0 or r.id == ident) and (bad is None or r.seq < bad.seq):
                    bad = r
                r = r.next
        name = op_name(req_op)
        why = f"the server does not support {name} (PROTOCOL.md §9): it answered E 1 ({msg})"
        err = errors.Unsupported(self.addr, name, msg)
        self.unsupported_op = req_op
        self.owner.unsupported(self, req_op, msg)
        self.fail(
            errors.LockdError(
                f"{self.addr} closed the connection: {why} to a request sent on it; "
                "upgrade lockd, or keep this client from sending §9 requests to it (watch_locks=False)"
            ),
            bad=bad,
            bad_err=err,
        )

    def _hello_refused(self, code: int, msg: str) -> None:
        if code == CODE_UNAUTHENTICATED:
            err: BaseException = errors.Unauthenticated(
                f"lockd: {self.addr} refused the hello (identity or secret): {msg}", msg
            )
        elif code == CODE_BAD_FRAME:
            err = errors.ServerError(
                "hello",
                code,
                f"{self.addr} does not know the hello op (a server without §8): remove the identity and secret, "
                f"or upgrade it: {msg}",
            )
        else:
            err = errors.ServerError("hello", code, msg)
        self._refuse(err)

    def _refuse(self, err: BaseException) -> None:
        """The server refused this connection's authentication: nothing sent
        on it after the hello was executed. Every request but a ping
        pending on it fails with ``err`` (definitive: not sent elsewhere)."""
        for op in (OP_ACQUIRE, OP_RELEASE, OP_RENEW, OP_VALIDATE, OP_WATCH, OP_INSPECT):
            table = self.pend[op]
            for head in list(table.values()):
                r: Req | None = head
                while r is not None:
                    nx = r.next
                    r.next = None
                    if not r.tomb:
                        r.rerr = err
                        r.finish(RES_REFUSED)
                    r = nx
            table.clear()
        self.owner.conn_refused(self, err)
        self.fail(err)

    # Ending.

    def fail(
        self, cause: BaseException, setup: bool = False, bad: Req | None = None, bad_err: BaseException | None = None
    ) -> None:
        """Close the connection once: queued requests are finished as
        definitely unsent, sent ones as lost — or, with ``setup`` (the server
        refused the connection before reading from it), as rejected. Their
        ``rerr`` is ``cause``. With ``bad`` (a §9 request the server did not
        know), ``bad`` fails with ``bad_err`` and the requests written after
        it are unsent. Every registered watch ends with reason 4 and
        ``cause``."""
        if self.dead:
            return
        self.dead = True
        self.cause = cause
        self.refused_at_setup = setup
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        q = self.queue
        self.queue = []
        for qr in q:
            qr.finish(RES_UNSENT)
        lost = RES_REJECTED if setup else RES_LOST
        cut = bad.seq if bad is not None else 0
        for table in self.pend.values():
            heads = list(table.values())
            table.clear()
            for head in heads:
                r: Req | None = head
                while r is not None:
                    nx = r.next
                    r.next = None
                    if r.tomb:
                        r.stop_timers()
                        r.state = DONE
                    elif r is bad:
                        r.rerr = bad_err
                        r.finish(RES_UNSUPPORTED)
                    elif cut and r.seq > cut:
                        r.finish(RES_UNSENT)  # behind the frame the server could not read
                    else:
                        r.rerr = cause
                        r.finish(lost)
                    r = nx
        self.wflight = 0
        watches = self.watches
        self.watches = {}
        self.nreg = 0
        for regs in watches.values():
            for reg in regs:
                reg.end(REASON_CANNOT_TELL, cause)
        if self.transport is not None:
            self.transport.abort()
        if not self.gone.done():
            self.gone.set_result(None)
        if not self.ready.done():
            self.ready.set_exception(self.end_cause())
            self.ready.exception()  # retrieved: only a dial waits for it
        self.owner.conn_ended(self)

    def idle(self) -> bool:
        """Nothing is queued or awaits an answer here (stand-ins aside)."""
        if self.queue:
            return False
        for table in self.pend.values():
            for head in table.values():
                r: Req | None = head
                while r is not None:
                    if not r.tomb:
                        return False
                    r = r.next
        return True

    def end_cause(self) -> BaseException:
        """Why the connection ended, with its address."""
        c = self.cause
        if self.refused_at_setup or isinstance(c, (errors.Closed, errors.Unauthenticated, errors.ServerError)):
            assert c is not None
            return c
        return ConnectionError(f"connection to {self.addr} lost: {c}")
