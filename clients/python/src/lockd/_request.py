"""One request of a call, across its attempts: :class:`Req`.

A request is attached to at most one connection at a time and moves through
these states (see :mod:`lockd._conn` for who moves it):

- ``QUEUED``: in the connection's send queue, **definitely unsent**.
- ``SENT``: encoded (the wire wait computed at that instant) and handed to
  the transport: **possibly sent**, awaiting its answer in the connection's
  pending table, with a timer for its answer (transport) deadline and, for
  an acquire with a wait, one for the caller's deadline (for a renewal, one
  for the attempt's own, shorter, timeout: see :meth:`Req.give_up_at`).
- ``DONE``: the attempt ended; ``res`` says how, and the waiter reads the
  answer fields.

A request whose caller stopped waiting while it was ``SENT`` (its deadline
passed, or it was cancelled) leaves a stand-in (``tomb``) in its place in the
pending table: the answer it gave up on may still come and must neither be
matched to a later request with the same id nor, if it is a grant, be left
held by nobody (nor, if it registers a watch, be left uncounted).

A watch request carries a :class:`WatchReg`, which the connection registers
when the server answers ``W`` and ends with the grant's ``L`` (see
:mod:`lockd._conn`).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Callable

from .proto import (
    MAX_WAIT,
    OP_ACQUIRE,
    OP_INSPECT,
    OP_RELEASE,
    OP_RENEW,
    OP_SHARED,
    OP_VALIDATE,
    OP_WATCH,
    encode_acquire,
    encode_inspect,
    encode_ping,
    encode_release,
    encode_renew,
    encode_shared,
    encode_validate,
    encode_watch,
)

if TYPE_CHECKING:
    from ._conn import Conn

# Request states.
IDLE = 0
QUEUED = 1
SENT = 2
DONE = 3

# Results of one attempt.
RES_NONE = 0
RES_ANSWER = 1  # an answer: rop, rtoken, rcode, rtail
RES_UNSENT = 2  # the connection died before the request was written
RES_LOST = 3  # the connection died with the request possibly sent: rerr says why
RES_EXPIRED = 4  # the send deadline had passed at the write: not sent
RES_ABANDONED = 5  # the transport deadline passed with the request possibly sent (the connection was closed)
RES_REFUSED = 6  # the server refused the connection's hello (E 5, or no H): rerr
RES_DEADLINE = 7  # the caller's deadline passed with the request possibly sent; the connection stays
RES_REJECTED = 8  # written, but the server refused the connection before reading from it: rerr
RES_UNSUPPORTED = 9  # the server answered E 1 to this §9 request and closed: rerr


class WatchReg:
    """One watch registered on a connection (or on its way): ``cb(reason,
    err)`` is called once when it ends — with the ``L``'s reason, or with
    reason 4 and the cause when its connection ended (``err`` is None for an
    ``L``). A detached registration (its watcher lost interest) still counts
    until its ``L`` comes, and calls nothing."""

    __slots__ = ("cb", "ended", "reason", "err")

    def __init__(self, cb: Callable[[int, BaseException | None], None] | None) -> None:
        self.cb = cb
        self.ended = False
        self.reason = 0  # the L's reason, once ended (4 when the connection ended)
        self.err: BaseException | None = None  # the connection's cause, when it ended with it

    def end(self, reason: int, err: BaseException | None) -> None:
        """End the registration: record how and call the callback once."""
        if self.ended:
            return
        self.ended = True
        self.reason = reason
        self.err = err
        cb, self.cb = self.cb, None
        if cb is not None:
            cb(reason, err)

    def detach(self) -> None:
        """Call nothing when it ends."""
        self.cb = None


class Req:
    """One request of a call, across its attempts (see the module doc)."""

    __slots__ = (
        "op",
        "acq",
        "key",
        "kb",
        "id",
        "lease",
        "limit",
        "reg",
        "seq",
        "wait0",
        "wait_end",
        "send_by",
        "hard_by",
        "timeout",
        "allowance",
        "moved",
        "avoid",
        "held_back",
        "from_addr",
        "tomb",
        "conn",
        "state",
        "next",
        "sent_at",
        "wire_wait",
        "fut",
        "timer",
        "ctimer",
        "attempt",
        "res",
        "rop",
        "rtoken",
        "rcode",
        "rtail",
        "rremain",
        "rinsp",
        "rerr",
    )

    def __init__(self, op: int, key: str, kb: bytes, ident: int, lease: int) -> None:
        self.op = op
        self.acq = op == OP_ACQUIRE or op == OP_SHARED  # answered by owner: A, T, B
        self.key = key
        self.kb = kb
        self.id = ident
        self.lease = lease
        self.limit = 0  # acquire shared: the key's limit
        self.reg: WatchReg | None = None  # watch: registered on this connection when answered W
        self.seq = 0  # the connection's count of frames written when this one was
        self.wait0 = False
        self.wait_end = 0.0  # acquire with wait > 0: the caller's deadline
        self.send_by = 0.0  # not sent at or after this instant
        self.hard_by = 0.0  # if set, the transport deadline is at most this
        self.timeout = 0.0  # transport deadline after the send (not for wait > 0 acquires)
        self.allowance = 0.0  # wait > 0 acquires: added to the wire wait for the transport deadline
        self.moved = ""  # address an M pointed to: send there next
        self.avoid = ""  # address to pass over next: it answered M without an address, or did not answer
        self.held_back = False  # an M named avoid and was not followed: the next one is
        self.from_addr = ""  # address of the last attempt's connection
        self.tomb = False  # a stand-in for a request whose caller stopped waiting
        self.conn: Conn | None = None
        self.state = IDLE
        self.next: Req | None = None  # chain of pending requests with the same id
        self.sent_at = 0.0
        self.wire_wait = 0
        self.fut: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None  # the transport deadline
        self.ctimer: asyncio.TimerHandle | None = None  # see give_up_at
        self.attempt = 0.0  # if set, one attempt's answer is awaited this long before the caller moves on
        self.res = RES_NONE
        self.rop = 0
        self.rtoken = 0
        self.rcode = 0
        self.rtail = ""
        self.rremain = 0  # V, I: lease time left in ms
        self.rinsp: tuple[int, int, int, int] | None = None  # I: holders, limit, waiters, remaining
        self.rerr: BaseException | None = None

    def encode(self, now: float) -> bytes:
        """The request's frame, its wire wait computed from the time left at
        ``now`` (rounded up, 1..255; 0 for a wait-0 acquire)."""
        op = self.op
        if self.acq:
            w = 0
            if not self.wait0:
                w = min(MAX_WAIT, max(1, math.ceil(self.wait_end - now)))
            self.wire_wait = w
            if op == OP_SHARED:
                return encode_shared(w, self.lease, self.id, self.limit, self.kb)
            return encode_acquire(w, self.lease, self.id, self.kb)
        if op == OP_RELEASE:
            return encode_release(self.id, self.kb)
        if op == OP_RENEW:
            return encode_renew(self.lease, self.id, self.kb)
        if op == OP_VALIDATE:
            return encode_validate(self.id, self.kb)
        if op == OP_WATCH:
            return encode_watch(self.id, self.kb)
        if op == OP_INSPECT:
            return encode_inspect(self.id, self.kb)
        return encode_ping(self.id)

    def answer_by(self) -> float:
        """The transport deadline of the attempt sent at ``sent_at``: by then
        a server that works has answered (a ``T`` comes at the end of the
        wire wait; ``allowance`` covers its way back)."""
        if self.acq and not self.wait0:
            d = self.sent_at + self.wire_wait + self.allowance
        else:
            d = self.sent_at + self.timeout
        if self.hard_by and self.hard_by < d:
            d = self.hard_by
        return d

    def give_up_at(self) -> float:
        """When the caller stops waiting for the attempt sent at ``sent_at``
        and leaves it a stand-in, the connection staying (0: never before
        the transport deadline): the caller's deadline of an acquire with a
        wait; ``sent_at + attempt`` for a renewal."""
        if self.acq and not self.wait0:
            return self.wait_end
        if self.attempt:
            return self.sent_at + self.attempt
        return 0.0

    def stand_in(self) -> Req:
        """A stand-in for this request in the pending table (see the module
        doc), with the same transport deadline."""
        t = Req(self.op, self.key, self.kb, self.id, 0)
        t.tomb = True
        t.seq = self.seq
        t.state = SENT
        t.wait0 = self.wait0
        t.sent_at = self.sent_at
        t.wire_wait = self.wire_wait
        t.timeout = self.timeout
        t.allowance = self.allowance
        t.hard_by = self.hard_by
        return t

    def stop_timers(self) -> None:
        """Cancel the attempt's timers."""
        for t in (self.timer, self.ctimer):
            if t is not None:
                t.cancel()
        self.timer = None
        self.ctimer = None

    def finish(self, res: int) -> None:
        """Record an attempt's result and wake the waiter."""
        self.res = res
        self.state = DONE
        self.stop_timers()
        f = self.fut
        if f is not None and not f.done():
            f.set_result(None)
