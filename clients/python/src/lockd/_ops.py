"""The lock operations: :class:`Core` runs acquire (exclusive or shared),
release, renew, ping, and the §9 queries — validate, watch, inspect — over a
:class:`~lockd._pool.Pool`, and the compensating release of grants nobody
will see. :class:`lockd.Client` is its public face."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Coroutine

from . import errors
from ._pool import (
    OUT_ABANDONED,
    OUT_ANSWER,
    OUT_CLOSED,
    OUT_DEADLINE,
    OUT_LOST,
    OUT_NO_CONN,
    OUT_NOT_SENT,
    OUT_NO_ROOM,
    OUT_REFUSED,
    OUT_REJECTED,
    OUT_UNSUPPORTED,
    Pool,
)
from ._request import Req, WatchReg
from ._settings import Settings
from ._types import Inspection, Lock, check_key, check_limit, check_wait, fresh, lease_secs
from .proto import (
    CODE_LIMIT_MISMATCH,
    CODE_LIMIT_REACHED,
    CODE_PERMISSION_DENIED,
    CODE_SHUTDOWN,
    CODE_UNAUTHENTICATED,
    OP_ACQUIRE,
    OP_BUSY,
    OP_ERROR,
    OP_INSPECT,
    OP_MOVED,
    OP_NOT_HELD,
    OP_PING,
    OP_RELEASE,
    OP_RENEW,
    OP_SHARED,
    OP_TIMEOUT,
    OP_VALIDATE,
    OP_WATCH,
    op_name,
)

log = logging.getLogger("lockd")


class Core:
    """The operations of one client on its event loop (started by the
    client's first use, see :meth:`lockd.Client.connect`)."""

    def __init__(self, st: Settings, loop: asyncio.AbstractEventLoop) -> None:
        self.st = st
        self.loop = loop
        self.rand = random.Random(int.from_bytes(os.urandom(16), "big"))
        self.pool = Pool(st, loop, self.rand)
        self.pool.late_grant_fn = self.compensate
        self.bg: set[asyncio.Task[None]] = set()
        self.unwatched = False  # a held lock could not be watched, and none could since (logged once)

    @property
    def closed(self) -> bool:
        """Whether the client was closed."""
        return self.pool.closed

    async def close(self) -> None:
        """Close the connections and wait for every background task."""
        await self.pool.close()
        await asyncio.gather(*list(self.bg), return_exceptions=True)

    def spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the background until it ends or the client closes."""
        t = self.loop.create_task(coro)
        self.bg.add(t)
        t.add_done_callback(self._bg_done)
        return t

    def _bg_done(self, t: asyncio.Task[None]) -> None:
        self.bg.discard(t)
        if not t.cancelled():
            t.exception()  # retrieved: background work logs its own failures

    def lease(self, lease: float | None, lock: Lock | None = None) -> int:
        """The lease to ask for: ``lease``, else the lock's own, else the
        client's default; in whole seconds."""
        if lease is None:
            if lock is not None and lock.lease > 0:
                return lock.lease
            lease = self.st.default_lease
        return lease_secs(lease)

    def compensate(self, key: str, token: int) -> None:
        """Release, in the background with release's retries, a grant the
        caller will never see."""
        if self.pool.closed:
            log.warning("lockd: a grant of %r (token %d) came after close: its lease will end it", key, token)
            return
        log.info("lockd: releasing %r (token %d), granted after its caller stopped waiting", key, token)

        async def rel() -> None:
            try:
                await self.release(Lock(key, token, 0.0))
            except errors.LockdError as e:
                log.warning("lockd: releasing %r (token %d) failed, its lease will end it: %s", key, token, e)

        self.spawn(rel())

    def _server_error(self, r: Req) -> errors.LockdError:
        code = r.rcode
        if code == CODE_PERMISSION_DENIED:
            return errors.PermissionDenied(r.key, r.rtail)
        if code == CODE_UNAUTHENTICATED:
            return errors.Unauthenticated(f"lockd: unauthenticated: {r.rtail}", r.rtail)
        if code == CODE_LIMIT_MISMATCH and r.op == OP_SHARED:
            return errors.LimitMismatch(r.key, r.limit, r.rtail)
        if code == CODE_LIMIT_REACHED and r.op == OP_WATCH:
            return errors.WatchLimit(r.key, r.rtail)
        return errors.ServerError(op_name(r.op), code, r.rtail)

    def _pause_ended(self, r: Req) -> errors.LockdError:
        if self.pool.closed:
            return errors.Closed("lockd: client closed")
        if r.op == OP_ACQUIRE and not r.wait0:
            return errors.Timeout(f"lockd: timed out, not acquired: {r.key!r} (no active member answered in time)")
        return self.pool.no_conn_err()

    async def acquire(self, key: str, wait: float, lease: float | None, limit: int = 0) -> Lock:
        """See :meth:`lockd.Client.acquire`; with a ``limit``,
        :meth:`lockd.Client.acquire_shared` (the same rules: §7 holds for
        ``S`` exactly as for ``A``)."""
        kb = check_key(key)
        check_wait(wait)
        ls = self.lease(lease)
        if limit:
            check_limit(limit)
        pool = self.pool
        loop = self.loop
        r = Req(OP_SHARED if limit else OP_ACQUIRE, key, kb, self.rand.getrandbits(64), ls)
        r.limit = limit
        now = loop.time()
        if wait == 0:
            r.wait0 = True
            r.send_by = r.hard_by = now + self.st.transport_timeout
            r.timeout = self.st.transport_timeout
        else:
            r.wait_end = r.send_by = now + wait
            r.allowance = self.st.answer_allowance
        while True:
            o = await pool.round_trip(r)
            if o != OUT_ANSWER:
                if o == OUT_DEADLINE:
                    raise errors.Timeout(
                        f"lockd: timed out, not acquired: {key!r} (the wait of {wait:g} s ran out before lockd "
                        "answered; a grant that comes later is released at once)"
                    )
                if o == OUT_NOT_SENT:
                    if r.wait0:
                        raise pool.no_conn_err()
                    raise errors.Timeout(f"lockd: timed out, not acquired: {key!r} (not sent before the deadline)")
                if o == OUT_NO_CONN:
                    raise pool.no_conn_err()  # an outage, not a holder: never Timeout
                if o == OUT_CLOSED:
                    raise errors.Closed("lockd: client closed")
                if o == OUT_REFUSED or o == OUT_UNSUPPORTED:
                    assert r.rerr is not None
                    raise fresh(r.rerr)
                if o == OUT_REJECTED:
                    # Not executed, but written: not resent (§7). The cause
                    # is the answer the caller needs (TLS, --max-conns).
                    raise pool.no_conn_err(r.rerr, r.from_addr)
                if pool.closed:
                    raise errors.ClosedIndeterminate("lockd: closed with the acquire possibly sent (outcome indeterminate)")
                if o == OUT_LOST:
                    why = f"the connection to {r.from_addr} ended: {r.rerr}"
                else:
                    why = f"no answer from {r.from_addr} within the transport timeout; that connection was closed"
                raise errors.Indeterminate(
                    f"lockd: {op_name(r.op)} of {key!r}: outcome indeterminate, do not assume the lock is held ({why})"
                )
            rop = r.rop
            if rop == OP_ACQUIRE:
                if pool.closed:
                    self.compensate(key, r.rtoken)
                    raise errors.ClosedIndeterminate("lockd: closed as the grant arrived")
                return Lock(key, r.rtoken, r.sent_at + ls, ls, limit)
            if rop == OP_TIMEOUT:
                raise errors.Timeout(f"lockd: timed out, not acquired: {key!r} is held")
            if rop == OP_BUSY:
                raise errors.Busy(f"lockd: server busy, not acquired: {key!r}")
            if rop == OP_MOVED:
                if pool.follow_moved(r):
                    continue
            elif rop == OP_ERROR:
                if r.rcode != CODE_SHUTDOWN:
                    raise self._server_error(r)
            else:
                raise errors.ServerError(op_name(r.op), 0, f"unexpected answer {op_name(rop)}")
            # Not executed, nowhere to go: pause, then send again (same
            # owner, same deadline).
            if not await pool.sleep(self.st.retry_pause, r.send_by):
                raise self._pause_ended(r)

    async def release(self, lock: Lock) -> None:
        """See :meth:`lockd.Client.release`."""
        kb = check_key(lock.key)
        r = Req(OP_RELEASE, lock.key, kb, lock.token, 0)
        r.hard_by = r.send_by = self.loop.time() + self.st.release_retry
        r.timeout = self.st.transport_timeout
        await self._retrying(r, r.hard_by, self.st.release_retry_interval)

    async def renew(self, lock: Lock, lease: float | None) -> Lock:
        """See :meth:`lockd.Client.renew`."""
        kb = check_key(lock.key)
        ls = self.lease(lease, lock)
        r = Req(OP_RENEW, lock.key, kb, lock.token, ls)
        limit = self.loop.time() + self.st.transport_timeout
        r.hard_by = r.send_by = limit
        r.timeout = self.st.transport_timeout
        r.attempt = self.st.renew_timeout(ls)
        await self._retrying(r, limit, self.st.retry_pause)
        return Lock(lock.key, lock.token, r.sent_at + ls, ls)

    async def _retrying(self, r: Req, limit: float, pause: float) -> None:
        """Run a release or renew: both act only on the exact token, so the
        client resends after a lost connection, until ``limit``. An attempt
        that got no answer in time is resent to another member first."""
        maybe = False  # an earlier attempt may have executed
        pool = self.pool

        def closed() -> errors.LockdError:
            if maybe:
                return errors.ClosedIndeterminate("lockd: closed with the request possibly sent (outcome indeterminate)")
            return errors.Closed("lockd: client closed")

        loop = self.loop
        while True:
            if pool.closed:
                raise closed()
            o = await pool.round_trip(r)
            if o == OUT_ANSWER:
                rop = r.rop
                if rop == OP_RELEASE or rop == OP_RENEW:
                    return
                if rop == OP_NOT_HELD:
                    if maybe and r.op == OP_RELEASE:
                        return
                    raise errors.NotHeld(f"lockd: lock not held: {r.key!r} token {r.id}")
                if rop == OP_MOVED:
                    if pool.follow_moved(r):
                        continue
                elif rop == OP_ERROR:
                    if r.rcode != CODE_SHUTDOWN:
                        raise self._server_error(r)
                else:
                    raise errors.ServerError(op_name(r.op), 0, f"unexpected answer {op_name(rop)}")
            elif o == OUT_CLOSED:
                raise closed()
            elif o == OUT_LOST:
                maybe = True
            elif o == OUT_ABANDONED or o == OUT_DEADLINE:
                maybe = True
                # That member did not answer in time (frozen, say): ask
                # another, which knows the active or is it.
                r.avoid = r.from_addr
                pool.unprefer(r.from_addr)
                log.warning(
                    "lockd: %s of %r got no answer from %s in %.2f s; trying another member",
                    op_name(r.op),
                    r.key,
                    r.from_addr,
                    loop.time() - r.sent_at,
                )
            elif o == OUT_REFUSED:
                assert r.rerr is not None
                raise fresh(r.rerr)
            elif o == OUT_NO_CONN:
                if not maybe:
                    raise pool.no_conn_err()
            # OUT_REJECTED: not executed; the exact token makes a resend safe.
            if loop.time() >= limit or not await pool.sleep(pause, limit):
                if pool.closed:
                    raise closed()
                if maybe:
                    raise errors.Indeterminate(
                        f"lockd: {op_name(r.op)} of {r.key!r}: no attempt could be confirmed in time"
                    )
                raise pool.no_conn_err()

    async def validate(self, key: str, token: int) -> float:
        """See :meth:`lockd.Client.validate`."""
        r = Req(OP_VALIDATE, key, check_key(key), _check_token(token), 0)
        await self._query(r)
        return r.rremain / 1000

    async def inspect(self, key: str) -> Inspection:
        """See :meth:`lockd.Client.inspect`."""
        r = Req(OP_INSPECT, key, check_key(key), self.rand.getrandbits(64), 0)
        await self._query(r)
        assert r.rinsp is not None
        holders, limit, waiters, remaining = r.rinsp
        return Inspection(key, holders, limit, waiters, r.rtoken, remaining / 1000)

    async def watch(self, key: str, token: int, reg: WatchReg) -> None:
        """Register ``reg`` for the grant ``token`` of ``key`` (a ``W``); it
        ends with the grant's ``L``, or with reason 4 when its connection
        ends. Raises :class:`NotHeld` (the token is not a current holder),
        :class:`WatchLimit`, and the errors of :meth:`validate`."""
        r = Req(OP_WATCH, key, check_key(key), _check_token(token), 0)
        r.reg = reg
        await self._query(r)

    async def _query(self, r: Req) -> None:
        """Run a validate, watch or inspect until its answer: none changes
        anything the server holds (a watch registered on a connection ends
        with it), so each is sent again — to another connection, another
        member — after a lost connection or an unanswered attempt, until
        ``transport_timeout``. ``M`` is followed; ``E`` 4 pauses and asks
        another member; an ``E`` 8 is sent again to another connection with
        room (the connection learnt its bound)."""
        pool = self.pool
        loop = self.loop
        limit = loop.time() + self.st.transport_timeout
        r.send_by = r.hard_by = limit
        r.timeout = self.st.transport_timeout
        sent = False  # an attempt was written and not answered
        name = op_name(r.op)
        while True:
            if pool.closed:
                raise errors.Closed("lockd: client closed")
            o = await pool.round_trip(r)
            if o == OUT_ANSWER:
                rop = r.rop
                if rop == r.op:
                    return
                if rop == OP_NOT_HELD:
                    raise errors.NotHeld(f"lockd: not held: {r.key!r} token {r.id} is not a current holder")
                if rop == OP_MOVED:
                    if pool.follow_moved(r):
                        continue
                elif rop == OP_ERROR:
                    if r.rcode == CODE_LIMIT_REACHED and r.op == OP_WATCH:
                        continue  # that connection is full: another one, or OUT_NO_ROOM
                    if r.rcode != CODE_SHUTDOWN:
                        raise self._server_error(r)
                    r.avoid = r.from_addr  # shutting down: ask another member
                    pool.unprefer(r.from_addr)
                else:
                    raise errors.ServerError(name, 0, f"unexpected answer {op_name(rop)}")
            elif o == OUT_CLOSED:
                raise errors.Closed("lockd: client closed")
            elif o == OUT_REFUSED or o == OUT_UNSUPPORTED:
                assert r.rerr is not None
                raise fresh(r.rerr)
            elif o == OUT_NO_ROOM:
                raise errors.WatchLimit(
                    r.key,
                    f"every connection to {r.from_addr or 'the server'} answered E 8 (it holds the server's bound "
                    "of watches, --max-watches-per-conn) and none of their watches has ended since",
                )
            elif o == OUT_LOST or o == OUT_ABANDONED or o == OUT_DEADLINE:
                sent = True
                if o != OUT_LOST:
                    r.avoid = r.from_addr
                    pool.unprefer(r.from_addr)
            elif o == OUT_NO_CONN or o == OUT_NOT_SENT:
                if not sent:
                    raise pool.no_conn_err()
            # OUT_REJECTED: not executed: send again.
            if loop.time() >= limit or not await pool.sleep(self.st.retry_pause, limit):
                if pool.closed:
                    raise errors.Closed("lockd: client closed")
                if sent:
                    raise errors.Timeout(
                        f"lockd: {name} of {r.key!r}: no answer from lockd within the transport timeout "
                        f"({self.st.transport_timeout:g} s)"
                    )
                raise pool.no_conn_err()

    async def ping(self) -> float:
        """See :meth:`lockd.Client.ping`."""
        pool = self.pool
        loop = self.loop
        r = Req(OP_PING, "", b"", self.rand.getrandbits(64), 0)
        limit = loop.time() + self.st.transport_timeout
        r.send_by = r.hard_by = limit
        r.timeout = self.st.transport_timeout
        while True:
            o = await pool.round_trip(r)
            if o == OUT_ANSWER:
                if r.rop == OP_PING:
                    return loop.time() - r.sent_at
                if r.rop == OP_MOVED and pool.follow_moved(r):
                    continue
                if not await pool.sleep(self.st.retry_pause, limit):
                    raise self._pause_ended(r)
            elif o == OUT_LOST or o == OUT_REJECTED:
                if pool.closed:
                    raise errors.Closed("lockd: client closed")
            elif o == OUT_ABANDONED:
                raise errors.Timeout("lockd: no pong within the transport timeout")
            elif o == OUT_CLOSED:
                raise errors.Closed("lockd: client closed")
            elif o == OUT_REFUSED:
                assert r.rerr is not None
                raise fresh(r.rerr)
            else:
                raise pool.no_conn_err()


def _check_token(token: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < 1 << 64:
        raise errors.InvalidArgument(f"lockd: a token is an int in 0..2**64-1, not {token!r}")
    return token
