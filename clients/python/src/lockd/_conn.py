"""One connection of the client: the write path, the reader, the pending table.

Everything here runs on the client's event loop; nothing is thread-safe and
nothing needs to be. A request (:class:`_Req`) is attached to at most one
connection at a time and moves through these states:

- ``QUEUED``: in ``_Conn.queue``, **definitely unsent**. The batch is written
  by one ``transport.write`` in a callback scheduled with ``call_soon`` when
  the first request of the batch is queued, so every request queued in the
  same turn of the loop leaves in one write. A connection that dies now hands
  the request back as ``UNSENT``: the client sends it on another connection
  with the same owner and deadline.
- ``SENT``: encoded (the wire wait computed at that instant) and handed to
  the transport: **possibly sent**. It waits in the pending table, keyed by
  its id per op, for its answer, with one timer for its answer deadline.
  A connection that dies now gives ``LOST`` (Indeterminate); the deadline
  gives ``ABANDONED`` and closes this exact connection for an acquire.
- ``DONE``: finished; the waiter reads the result fields.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from typing import TYPE_CHECKING, Callable, ClassVar

from . import errors
from .proto import (
    CODE_BAD_FRAME,
    CODE_UNAUTHENTICATED,
    OP_ACQUIRE,
    OP_BUSY,
    OP_ERROR,
    OP_HELLO,
    OP_MOVED,
    OP_NOT_HELD,
    OP_PING,
    OP_RELEASE,
    OP_RENEW,
    OP_TIMEOUT,
    FrameError,
    _scan_response,
    encode_acquire,
    encode_hello,
    encode_ping,
    encode_release,
    encode_renew,
)

if TYPE_CHECKING:
    from .client import Client

# Request states.
IDLE = 0
QUEUED = 1
SENT = 2
DONE = 3

# Results of one attempt.
RES_NONE = 0
RES_ANSWER = 1  # an answer: rop, rtoken, rcode, rtail
RES_UNSENT = 2  # the connection died before the request was written
RES_LOST = 3  # the connection died with the request possibly sent
RES_EXPIRED = 4  # the send deadline had passed at the write: not sent
RES_ABANDONED = 5  # the answer deadline passed with the request possibly sent
RES_REFUSED = 6  # the server refused the connection's hello (E 5, or no H): rerr

# How soon after the dial a connection that ends without a byte from the
# server counts as rejected by it (lockd at --max-conns accepts and closes).
REJECTED_WITHIN = 1.0


class _Req:
    """One request of a call, across its attempts (see the module doc)."""

    __slots__ = (
        "op",
        "key",
        "kb",
        "id",
        "lease",
        "wait0",
        "wait_end",
        "send_by",
        "hard_by",
        "timeout",
        "allowance",
        "moved",
        "avoid",
        "from_addr",
        "tomb",
        "conn",
        "state",
        "next",
        "sent_at",
        "wire_wait",
        "fut",
        "timer",
        "res",
        "rop",
        "rtoken",
        "rcode",
        "rtail",
        "rerr",
    )

    def __init__(self, op: int, key: str, kb: bytes, ident: int, lease: int) -> None:
        self.op = op
        self.key = key
        self.kb = kb
        self.id = ident
        self.lease = lease
        self.wait0 = False
        self.wait_end = 0.0  # acquire with wait > 0: the end of the caller's wait
        self.send_by = 0.0  # not sent at or after this instant
        self.hard_by = 0.0  # if set, the answer deadline is at most this
        self.timeout = 0.0  # answer deadline after the send (not for wait > 0 acquires)
        self.allowance = 0.0  # wait > 0 acquires: added to the wire wait
        self.moved = ""  # address an M pointed to: send there next
        self.avoid = ""  # address whose node answered M without an address
        self.from_addr = ""  # address of the last attempt's connection
        self.tomb = False  # a stand-in for an abandoned request
        self.conn: _Conn | None = None
        self.state = IDLE
        self.next: _Req | None = None  # chain of pending requests with the same id
        self.sent_at = 0.0
        self.wire_wait = 0
        self.fut: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.res = RES_NONE
        self.rop = 0
        self.rtoken = 0
        self.rcode = 0
        self.rtail = ""
        self.rerr: BaseException | None = None

    def encode(self, now: float) -> bytes:
        """The request's frame, its wire wait computed from the time left at
        ``now`` (rounded up, 1..255; 0 for a wait-0 acquire)."""
        op = self.op
        if op == OP_ACQUIRE:
            w = 0
            if not self.wait0:
                w = math.ceil(self.wait_end - now)
                if w > 255:
                    w = 255
                elif w < 1:
                    w = 1
            self.wire_wait = w
            return encode_acquire(w, self.lease, self.id, self.kb)
        if op == OP_RELEASE:
            return encode_release(self.id, self.kb)
        if op == OP_RENEW:
            return encode_renew(self.lease, self.id, self.kb)
        return encode_ping(self.id)

    def call_end(self) -> float:
        """The call's deadline: a grant taken after it is compensated."""
        return self.send_by if self.wait0 else self.wait_end

    def answer_by(self) -> float:
        """The deadline for the answer of the attempt sent at ``sent_at``."""
        if self.op == OP_ACQUIRE and not self.wait0:
            d = self.sent_at + self.wire_wait + self.allowance
        else:
            d = self.sent_at + self.timeout
        if self.hard_by and self.hard_by < d:
            d = self.hard_by
        return d

    def finish(self, res: int) -> None:
        """Record an attempt's result and wake the waiter."""
        self.res = res
        self.state = DONE
        t = self.timer
        if t is not None:
            t.cancel()
            self.timer = None
        f = self.fut
        if f is not None and not f.done():
            f.set_result(None)


class _Conn(asyncio.Protocol):
    """One TCP (or TLS) connection to one address."""

    # Tests set this: it runs before a batch is taken for writing; returning
    # False fails the connection there, every queued request definitely unsent.
    hook_before_write: ClassVar[Callable[[_Conn], bool] | None] = None

    def __init__(self, cl: Client, addr: str, hello: bytes | None) -> None:
        self.cl = cl
        self.addr = addr
        self.loop = cl._loop
        self.transport: asyncio.Transport | None = None
        self.queue: list[_Req] = []
        self.pend: dict[int, dict[int, _Req]] = {
            OP_ACQUIRE: {},
            OP_RELEASE: {},
            OP_RENEW: {},
            OP_PING: {},
        }
        self.dead = False
        self.flushing = False  # a flush is scheduled
        self.rbuf = b""
        self.gone: asyncio.Future[None] = self.loop.create_future()
        self.cause: BaseException | None = None
        self.opened = self.loop.time()
        self.heard = False
        self.hello = hello  # the H frame's tail, None without an identity and secret
        self.hello_nonce = 0
        self.hello_pending = False
        self.identity = ""  # the identity the server's H named
        self.write_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Store the transport and send the hello first, before any request."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=1 << 20)
        if self.hello is not None:
            self.hello_nonce = self.cl._rand64()
            self.hello_pending = True
            transport.write(encode_hello(self.hello_nonce, self.hello))

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every request on the connection (unsent ones are resent)."""
        self.fail(exc if exc is not None else ConnectionResetError("server closed the connection"))

    def pause_writing(self) -> None:
        """The server stopped reading: fail after a whole transport timeout."""
        if self.write_timer is None:
            self.write_timer = self.loop.call_later(self.cl._transport_timeout, self._write_blocked)

    def resume_writing(self) -> None:
        """The server reads again."""
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def _write_blocked(self) -> None:
        self.write_timer = None
        self.fail(TimeoutError(f"write to {self.addr} blocked for the transport timeout"))

    # The write path.

    def enqueue(self, r: _Req) -> bool:
        """Queue ``r`` for the next batch; False if the connection is dead."""
        if self.dead:
            return False
        r.conn = self
        r.state = QUEUED
        r.res = RES_NONE
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
        h = _Conn.hook_before_write
        if h is not None and not h(self):
            self.fail(errors.LockdError("test hook: connection failed before the write"))
            return
        q = self.queue
        self.queue = []
        cl = self.cl
        cl._rr += 1  # round-robin by batch: the next requests go to the next connection
        loop = self.loop
        now = loop.time()
        parts = []
        pend = self.pend
        call_at = loop.call_at
        expire = self._expire
        for r in q:
            if now >= r.send_by:
                r.finish(RES_EXPIRED)
                continue
            parts.append(r.encode(now))
            r.state = SENT
            r.sent_at = now
            table = pend[r.op]
            head = table.get(r.id)
            if head is None:
                table[r.id] = r
            else:
                while head.next is not None:
                    head = head.next
                head.next = r
            r.timer = call_at(r.answer_by(), expire, r)
        if parts:
            assert self.transport is not None
            self.transport.write(b"".join(parts))

    def _expire(self, r: _Req) -> None:
        """The answer deadline of ``r`` passed with the request possibly sent."""
        r.timer = None
        if r.conn is not self or r.state != SENT:
            return
        self._abandon(r)
        r.finish(RES_ABANDONED)
        if r.op == OP_ACQUIRE:
            # Close that exact connection: a grant not yet handed to its
            # socket is released by the server at once.
            self.fail(errors.LockdError("acquire abandoned with its answer outstanding"))
        elif self.loop.time() >= r.sent_at + r.timeout / 2:
            # No answer for half a transport timeout or more: the
            # connection is taken to be broken.
            self.fail(errors.LockdError("request abandoned with its answer outstanding"))

    def _abandon(self, r: _Req) -> None:
        """Put a stand-in in ``r``'s place in its chain: the answer ``r``
        gave up on may still come and must not be matched to a later request
        with the same id. A stand-in acquire releases a grant it receives."""
        table = self.pend[r.op]
        stand = _Req(r.op, r.key, r.kb, r.id, 0)
        stand.tomb = True
        stand.state = SENT
        head = table.get(r.id)
        if head is r:
            stand.next = r.next
            table[r.id] = stand
        else:
            while head is not None and head.next is not r:
                head = head.next
            if head is not None:
                stand.next = r.next
                head.next = stand
        r.next = None

    def cancel_attempt(self, r: _Req) -> None:
        """The waiter of ``r`` was cancelled: take ``r`` back. A queued
        request is removed (never sent); a sent one leaves a stand-in, and an
        acquire closes this connection; a grant that arrived before the
        waiter could take it is released again."""
        st = r.state
        if st == QUEUED:
            try:
                self.queue.remove(r)
            except ValueError:
                pass
        elif st == SENT:
            if r.timer is not None:
                r.timer.cancel()
                r.timer = None
            self._abandon(r)
            if r.op == OP_ACQUIRE:
                self.fail(errors.LockdError("acquire cancelled with its answer outstanding"))
        elif st == DONE and r.res == RES_ANSWER and r.op == OP_ACQUIRE and r.rop == OP_ACQUIRE:
            self.cl._compensate(r.key, r.rtoken)
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
            self.cl._established = True
        pos = 0
        n = len(data)
        pend = self.pend
        try:
            while pos < n:
                f = _scan_response(data, pos)
                if f is None:
                    break
                end, op, req_op, ident, token, code, ts, te = f
                pos = end
                if op == OP_ERROR:
                    if req_op == OP_HELLO:
                        self._hello_refused(code, data[ts:te].decode("utf-8", "replace"))
                        return
                    if code == CODE_BAD_FRAME:
                        self.fail(errors.LockdError("server reported a bad frame (E 1)"))
                        return
                    if code == CODE_UNAUTHENTICATED:
                        msg = data[ts:te].decode("utf-8", "replace")
                        self._refuse(
                            errors.Unauthenticated(
                                f"lockd: {self.addr} requires authentication: {msg}"
                                if self.hello is None
                                else f"lockd: {self.addr} refused the request as unauthenticated: {msg}",
                                msg,
                            )
                        )
                        return
                    t = req_op
                elif op == OP_TIMEOUT or op == OP_BUSY:
                    t = OP_ACQUIRE
                elif op == OP_NOT_HELD or op == OP_MOVED:
                    t = req_op
                elif op == OP_HELLO:
                    if self.hello_pending and ident == self.hello_nonce:
                        self.hello_pending = False
                        self.identity = data[ts:te].decode("utf-8", "replace")
                        self.cl._hello_ok()
                    continue
                else:
                    t = op
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
                r.rop = op
                r.rtoken = token
                r.rcode = code
                if op == OP_MOVED or op == OP_ERROR:
                    r.rtail = data[ts:te].decode("utf-8", "replace")
                if r.tomb:
                    if op == OP_ACQUIRE:
                        # A grant to an acquire whose caller gave up: release it.
                        self.cl._compensate(r.key, token)
                    continue
                r.finish(RES_ANSWER)
        except FrameError as e:
            self.fail(errors.LockdError(f"server sent a bad frame: {e}"))
            return
        if pos < n:
            self.rbuf = data[pos:]

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
        on it after the hello was executed. Every acquire, release and renew
        pending on it fails with ``err`` (definitive: not sent elsewhere)."""
        for op in (OP_ACQUIRE, OP_RELEASE, OP_RENEW):
            table = self.pend[op]
            for head in list(table.values()):
                r: _Req | None = head
                while r is not None:
                    nx = r.next
                    r.next = None
                    if not r.tomb:
                        r.rerr = err
                        r.finish(RES_REFUSED)
                    r = nx
            table.clear()
        self.cl._auth_refused(err)
        self.fail(err)

    # Ending.

    def fail(self, cause: BaseException) -> None:
        """Close the connection once: queued requests are finished as
        definitely unsent, sent ones as lost."""
        if self.dead:
            return
        self.dead = True
        self.cause = cause
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        q = self.queue
        self.queue = []
        for qr in q:
            qr.finish(RES_UNSENT)
        for table in self.pend.values():
            heads = list(table.values())
            table.clear()
            for head in heads:
                r: _Req | None = head
                while r is not None:
                    nx = r.next
                    r.next = None
                    if not r.tomb:
                        r.finish(RES_LOST)
                    r = nx
        if self.transport is not None:
            self.transport.abort()
        if not self.gone.done():
            self.gone.set_result(None)

    def idle(self) -> bool:
        """Nothing is queued or awaits an answer here (stand-ins aside)."""
        if self.queue:
            return False
        for table in self.pend.values():
            for head in table.values():
                r: _Req | None = head
                while r is not None:
                    if not r.tomb:
                        return False
                    r = r.next
        return True

    def end_cause(self) -> BaseException:
        """Why the connection ended: :class:`errors.Rejected` if the server
        closed it at once without a frame, else the failure with the address."""
        c = self.cause
        if isinstance(c, (errors.Closed, errors.Unauthenticated, errors.ServerError, ssl.SSLError)):
            return c
        if not self.heard and self.loop.time() - self.opened < REJECTED_WITHIN:
            return errors.Rejected(self.addr)
        return ConnectionError(f"connection to {self.addr} lost: {c}")
