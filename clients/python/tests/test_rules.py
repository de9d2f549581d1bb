"""PROTOCOL.md §7, rule by rule, against the scripted fake server, where a
fault can be placed exactly (the Go client's client/fault_test.go and
client/cluster_test.go cover the same cases)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import lockd
from harness import Fake, FConn, FReq, dead_addr, loop_lag, pool, wait_for
from lockd import proto
from lockd._conn import Conn


def fast(*addrs: str, **over: Any) -> lockd.Client:
    """A client with short intervals, as the Go tests' fastConfig."""
    kw: dict[str, Any] = dict(
        dial_timeout=1.0,
        reconnect_interval=0.1,
        transport_timeout=2.0,
        answer_allowance=0.3,
        release_retry=2.0,
        release_retry_interval=0.05,
        retry_pause=0.03,
    )
    kw.update(over)
    return lockd.Client(list(addrs), **kw)


async def up(c: lockd.Client, n: int) -> None:
    await c.connect()
    await wait_for(f"{n} live connections", lambda: c.live_connections() == n)


def silent(fc: FConn, r: FReq) -> None:
    """Answer pings and nothing else."""
    if r.op == proto.OP_PING:
        fc.auto(r)


def grant_777(fc: FConn, r: FReq) -> None:
    if r.op == proto.OP_ACQUIRE:
        fc.send(proto.encode_acquired(r.id, 777, r.key.encode()))
    else:
        fc.auto(r)


async def test_conns_per_address() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        await up(c, 2)
        await asyncio.sleep(0.05)
        assert len(f.conns) == 2, "one address: two connections"
    f1, f2 = await Fake().start(), await Fake().start()
    async with fast(f1.addr, f2.addr) as c:
        await up(c, 2)
        await asyncio.sleep(0.05)
        assert (len(f1.conns), len(f2.conns)) == (1, 1), "two addresses: one each"
    for x in (f, f1, f2):
        await x.close()


async def test_round_robin() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        await up(c, 2)
        per: dict[int, int] = {}
        for _ in range(20):
            await c.ping()
            r = await f.next()
            per[id(r.conn)] = per.get(id(r.conn), 0) + 1
        assert sorted(per.values()) == [10, 10], per
    await f.close()


async def test_pipelined_batch_one_write() -> None:
    """Requests made in one turn of the loop leave in one batch, and the next
    batch goes to the next connection."""
    f = await Fake().start()
    async with fast(f.addr) as c:
        await up(c, 2)
        await asyncio.gather(*(c.ping() for _ in range(30)))
        rs = [await f.next() for _ in range(30)]
        assert len({id(r.conn) for r in rs}) == 1, "one batch, one connection"
        await asyncio.gather(*(c.ping() for _ in range(30)))
        rs2 = [await f.next() for _ in range(30)]
        assert len({id(r.conn) for r in rs2}) == 1
        assert rs2[0].conn is not rs[0].conn, "the next batch goes to the next connection"
    await f.close()


@pytest.mark.timeout(40)
async def test_drop_excluded_and_redialled_every_3s() -> None:
    """A dropped connection gets no more requests and is dialled again after
    the reconnect interval (the default 3 s), not before."""
    f = await Fake().start()
    async with lockd.Client([f.addr]) as c:
        await up(c, 2)
        first, _ = await f.accepts.get()
        await f.accepts.get()
        dropped = time.monotonic()
        first.close()
        await wait_for("one live connection", lambda: c.live_connections() == 1)
        for _ in range(10):
            await c.ping()
            r = await f.next()
            assert r.conn is not first, "request sent on the dropped connection"
        _, at = await asyncio.wait_for(f.accepts.get(), 6)
        el = at - dropped
        assert 3.0 <= el <= 4.0, f"redialled after {el:.2f} s, want the 3 s interval"
        await up(c, 2)
    await f.close()


@pytest.mark.timeout(40)
async def test_dead_address_redialled_every_3s() -> None:
    """An address that refuses connections is dialled again every 3 s in the
    background: a server that comes up there 4 s in is reached at the 6 s
    dial, and the live address serves meanwhile."""
    live = await Fake().start()
    addr = dead_addr()
    async with lockd.Client([live.addr, addr]) as c:
        start = time.monotonic()
        await wait_for("the live connection", lambda: c.live_connections() == 1)
        for _ in range(5):
            await c.ping()
        await asyncio.sleep(4 - (time.monotonic() - start))
        late = await Fake().start(addr)
        _, at = await asyncio.wait_for(late.accepts.get(), 5)
        el = at - start
        assert 5.9 <= el <= 7.0, f"dead address reached {el:.2f} s in, want at the 6 s redial"
        await late.close()
    await live.close()


async def test_pipelined_out_of_order() -> None:
    """50 acquires in flight on one connection, answered in reverse order,
    each matched to its own owner."""
    n = 50
    got: list[FReq] = []

    def reverse(fc: FConn, r: FReq) -> None:
        got.append(r)
        if len(got) == n:
            fc.send(b"".join(proto.encode_acquired(q.id, q.id ^ 0xABCDEF, q.key.encode()) for q in reversed(got)))

    f = await Fake(reverse).start()
    async with fast(f.addr, conns_per_addr=1) as c:
        await up(c, 1)
        locks = await asyncio.gather(*(c.acquire("same", wait=3) for _ in range(n)))
        owners = {r.id for r in got}
        assert len(owners) == n, "every acquire has its own owner"
        assert {lk.token ^ 0xABCDEF for lk in locks} == owners
    await f.close()


async def test_wire_wait() -> None:
    """The wait field: the time left rounded up to whole seconds, capped at 255."""
    f = await Fake().start()
    async with fast(f.addr) as c:
        for wait, wire in ((0, 0), (0.001, 1), (1, 1), (2.5, 3), (255, 255)):
            await c.acquire("wire-wait", wait=wait, lease=7)
            r = await f.next()
            assert (r.op, r.wait, r.lease, r.key) == (proto.OP_ACQUIRE, wire, 7, "wire-wait"), f"wait {wait}"
    await f.close()


async def test_fresh_owner_per_call() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        for _ in range(20):
            await c.acquire("k", wait=1)
        owners = {(await f.next()).id for _ in range(20)}
        assert len(owners) == 20
    await f.close()


async def test_moved_follows_and_recomputes_wait() -> None:
    """M naming another node: connect there, resend with the same owner and
    the wire wait recomputed from the same deadline; prefer it afterwards."""
    active = await Fake().start()

    async def later(fc: FConn, r: FReq) -> None:
        async def go() -> None:
            await asyncio.sleep(1.3)
            fc.send(proto.encode_moved(r.op, r.id, active.addr.encode()))

        asyncio.ensure_future(go())

    standby = await Fake(later).start()
    async with fast(standby.addr) as c:
        lk = await c.acquire("moved", wait=10)
        r1, r2 = await standby.next(), await active.next()
        assert r1.wait == 10
        assert r2.wait in (8, 9), f"resend wait={r2.wait}, want 10 - 1.3 s rounded up"
        assert (r2.id, r2.key) == (r1.id, "moved"), "same owner"
        assert lk.token > 0
        for _ in range(4):
            await c.ping()
            await active.next()
        await standby.none(0.05)
    await standby.close()
    await active.close()


async def test_moved_no_address_pauses_and_resends() -> None:
    """M without an address: pause, send again with the same owner until the
    deadline; then Timeout, and nothing more is sent."""
    n = 0

    def handler(fc: FConn, r: FReq) -> None:
        nonlocal n
        if r.op == proto.OP_ACQUIRE and r.key == "grant-third":
            n += 1
            if n >= 3:
                fc.auto(r)
                return
        fc.send(proto.encode_moved(r.op, r.id, b""))

    f = await Fake(handler).start()
    async with fast(f.addr, retry_pause=0.1) as c:
        start = time.monotonic()
        await c.acquire("grant-third", wait=5)
        assert time.monotonic() - start >= 0.2, "two pauses of 100 ms"
        r0 = await f.next()
        for _ in range(2):
            assert (await f.next()).id == r0.id
        start = time.monotonic()
        with pytest.raises(lockd.Timeout):
            await c.acquire("never", wait=0.7)
        assert time.monotonic() - start >= 0.7, "gave up before the deadline"
        owner = (await f.next()).id
        for r in f.drain():
            assert r.id == owner
        await asyncio.sleep(0.2)
        for r in f.drain():
            assert r.id == owner and r.at - start < 0.75, "sent after the deadline"
    await f.close()


async def test_empty_moved_tries_another_member() -> None:
    """M without an address from one member: after 50..200 ms the same
    request (owner, deadline) goes to another member."""
    lost = await Fake(lambda fc, r: fc.send(proto.encode_moved(r.op, r.id, b""))).start()
    act = await Fake().start()
    async with lockd.Client([lost.addr, act.addr]) as c:  # default retry_pause: 100 ms
        await up(c, 2)
        detours = 0
        for _ in range(10):
            await c.acquire("empty-m", wait=5)
            granted = await act.next()
            for r in lost.drain():
                assert r.id == granted.id
                gap = granted.at - r.at
                assert 0.05 <= gap <= 1.0, f"resent after {gap:.3f} s"
                assert granted.wait <= r.wait
                detours += 1
            if detours >= 2:
                break
        assert detours > 0, "no request went to the member without an active"
    await lost.close()
    await act.close()


async def test_shutting_down_retried() -> None:
    """E 4: not executed; sent again with the same owner."""
    n = 0

    def handler(fc: FConn, r: FReq) -> None:
        nonlocal n
        n += 1
        if n == 1:
            fc.send(proto.encode_error(r.op, r.id, proto.CODE_SHUTDOWN, b"shutting down"))
            return
        fc.auto(r)

    f = await Fake(handler).start()
    async with fast(f.addr) as c:
        await c.acquire("e4", wait=3)
        a, b = await f.next(), await f.next()
        assert a.id == b.id
    await f.close()


async def test_deadline_before_send_never_sent() -> None:
    """No connection until after the deadline: NoConnection (an outage, not
    a Timeout), and the request is never sent."""
    addr = dead_addr()
    async with fast(addr) as c:
        start = time.monotonic()
        with pytest.raises(lockd.NoConnection) as ei:
            await c.acquire("late", wait=0.5)
        assert not isinstance(ei.value, lockd.Timeout)
        assert time.monotonic() - start >= 0.5
        assert ei.value.cause is not None, "the dial error is given"
        f = await Fake().start(addr)
        await up(c, 2)
        await f.none(0.3)
        await f.close()


async def test_retry_while_definitely_unsent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that dies before the batch is written: the same request
    (owner, deadline) goes out on another one, once."""
    killed: list[int] = []
    flush = Conn._flush

    def fail_first_acquire_batch(conn: Conn) -> None:
        if conn.queue and conn.queue[0].op == proto.OP_ACQUIRE and not killed:
            killed.append(conn.queue[0].id)
            conn.fail(ConnectionResetError("failed by the test before the write"))
            return
        flush(conn)

    monkeypatch.setattr(Conn, "_flush", fail_first_acquire_batch)
    f = await Fake().start()
    async with fast(f.addr) as c:
        await up(c, 2)
        await c.acquire("unsent", wait=2)
        assert killed, "the batch was not failed"
        r = await f.next()
        assert r.id == killed[0]
        await f.none(0.1)
    await f.close()


async def test_no_resend_after_possible_send() -> None:
    """The server reads the acquire and drops the connection: Indeterminate,
    and nothing is sent again (wait > 0 and wait 0)."""

    def drop(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_ACQUIRE:
            fc.close()

    f = await Fake(drop).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        for wait in (2, 0):
            with pytest.raises(lockd.Indeterminate) as ei:
                await c.acquire("dropped", wait=wait)
            assert "connection" in str(ei.value)
            await f.next()
            await f.none(0.2)
            await up(c, 2)
    await f.close()


async def test_refused_before_the_first_answer_is_no_connection() -> None:
    """A server that closes a connection before answering its first frame
    (the ping a client without a hello sends first; lockd at --max-conns)
    read nothing behind it: the acquire written behind it is NoConnection
    with cause Rejected, not Indeterminate, and is not sent again."""
    refused = 0

    def slam(fc: FConn, r: FReq) -> None:
        nonlocal refused
        refused += 1
        fc.close()

    f = await Fake(probe=slam).start()
    async with fast(f.addr, conns_per_addr=1, reconnect_interval=5) as c:
        await c.connect()
        for wait in (2, 0):
            with pytest.raises(lockd.NoConnection) as en:
                await c.acquire(f"refused-{wait}", wait=wait)
            assert isinstance(en.value.cause, lockd.Rejected), repr(en.value.cause)
        assert refused >= 1
        await f.none(0.2)
    await f.close()


async def test_caller_deadline_then_transport_deadline() -> None:
    """A server that answers nothing: the caller gets Timeout at its own
    deadline, to the millisecond, and the connection stays; when the
    transport deadline (send + wire wait + allowance) passes too, that
    connection, only it, is closed, and a release pending on it is reported
    as lost, retried on the other connection."""
    f = await Fake(silent).start()
    async with fast(f.addr) as c:  # allowance 0.3 s
        await up(c, 2)
        loop = asyncio.get_running_loop()
        start = loop.time()
        lag = loop_lag(start + 0.5)
        with pytest.raises(lockd.Timeout):
            await c.acquire("unanswered", wait=0.5)
        el = loop.time() - start
        assert 0.5 <= el < 0.55 + lag(), f"Timeout after {el:.3f} s, want the caller's 0.5 s (the loop ran {lag():.3f} s late)"
        r = await f.next()
        assert r.wait == 1
        assert not r.conn.closed.is_set() and c.live_connections() == 2, "the caller's deadline cost a connection"
        await asyncio.wait_for(r.conn.closed.wait(), 2)
        closed_at = loop.time() - start
        assert closed_at >= 1.3, f"closed {closed_at:.2f} s in, before wire wait + allowance"
        for fc in f.conns:
            if fc is not r.conn:
                assert not fc.closed.is_set(), "another connection was closed too"
    await f.close()


async def test_transport_deadline_reports_the_others_truthfully() -> None:
    """wait=0 gets no answer within the transport timeout: Indeterminate,
    the connection is closed, and another acquire waiting on it is
    Indeterminate too, saying that its connection was closed."""
    f = await Fake(silent).start()
    async with fast(f.addr, conns_per_addr=1, transport_timeout=0.5) as c:
        await up(c, 1)
        other = asyncio.ensure_future(c.acquire("waiting", wait=10))
        with pytest.raises(lockd.Indeterminate):
            await c.acquire("unanswered")
        with pytest.raises(lockd.Indeterminate) as ei:
            await other
        assert "no answer from" in str(ei.value), ei.value
    await f.close()


async def test_timeout_answer_at_end_of_wait_is_definitive() -> None:
    """A T sent right at the end of the wire wait is read as Timeout, thanks
    to the allowance, not as Indeterminate."""

    def late_t(fc: FConn, r: FReq) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(r.wait + 0.05, fc.send, proto.encode_timeout(r.id, r.key.encode()))

    f = await Fake(late_t).start()
    async with fast(f.addr) as c:
        with pytest.raises(lockd.Timeout):
            await c.acquire("t-at-end", wait=1)
    await f.close()


@pytest.mark.timeout(40)
async def test_wait_zero_transport_deadline() -> None:
    """wait=0: one server attempt with its own transport deadline, 5 s by
    default, for finding a connection, sending and the answer."""
    f = await Fake(silent).start()
    async with lockd.Client([f.addr]) as c:
        await up(c, 2)
        start = time.monotonic()
        with pytest.raises(lockd.Indeterminate):
            await c.acquire("w0")
        el = time.monotonic() - start
        assert 5.0 <= el <= 5.6, f"gave up after {el:.2f} s, want the 5 s transport deadline"
        r = await f.next()
        assert r.wait == 0
        await asyncio.wait_for(r.conn.closed.wait(), 2)
        await f.none(0.1)
    # One deadline for the whole call: a connection that comes up late in
    # the window does not restart it.
    addr = dead_addr()
    async with fast(addr, transport_timeout=1.0, reconnect_interval=0.02) as c:
        start = time.monotonic()
        task = asyncio.ensure_future(c.acquire("w0-late"))
        await asyncio.sleep(0.6)
        late = await Fake(silent).start(addr)
        with pytest.raises(lockd.Indeterminate):
            await task
        el = time.monotonic() - start
        assert 1.0 <= el <= 1.4, f"Indeterminate after {el:.2f} s, want at the 1 s transport deadline"
        await late.close()
    async with fast(dead_addr(), transport_timeout=0.4) as c:
        start = time.monotonic()
        with pytest.raises(lockd.NoConnection):
            await c.acquire("w0")
        assert time.monotonic() - start >= 0.4
    await f.close()


async def test_late_grant_compensated() -> None:
    """An A that comes after the caller's deadline: the call raised Timeout
    at its deadline; the grant is released (exact token); the connection
    stays."""

    def late_a(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_ACQUIRE:
            asyncio.get_running_loop().call_later(0.4, fc.send, proto.encode_acquired(r.id, 777, r.key.encode()))
            return
        fc.auto(r)

    f = await Fake(late_a).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        # wait 0.2 s goes out as wire wait 1 s; the A at 0.4 s is past the
        # caller's deadline.
        loop = asyncio.get_running_loop()
        start = loop.time()
        lag = loop_lag(start + 0.2)
        with pytest.raises(lockd.Timeout):
            await c.acquire("late-grant", wait=0.2)
        assert loop.time() - start < 0.3 + lag(), "Timeout came after the caller's deadline"
        a = await f.next()
        r = await f.next()
        assert (r.op, r.id, r.key) == (proto.OP_RELEASE, 777, "late-grant")
        assert not a.conn.closed.is_set() and c.live_connections() == 2
    await f.close()


async def test_cancelled_after_grant_compensated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grant that arrived but was not yet taken by its caller, which is then
    cancelled, is released again (exact token)."""
    f = await Fake(grant_777).start()
    target: list[asyncio.Task[lockd.Lock]] = []
    orig = Conn.data_received

    def then_cancel(self: Conn, data: bytes) -> None:
        orig(self, data)  # the A is handed to the request here...
        if target and not target[0].done():
            target[0].cancel()  # ...and the caller is cancelled before it runs

    monkeypatch.setattr(Conn, "data_received", then_cancel)
    async with fast(f.addr) as c:
        await up(c, 2)
        target.append(asyncio.ensure_future(c.acquire("late-grant", wait=3)))
        with pytest.raises(asyncio.CancelledError):
            await target[0]
        assert (await f.next()).op == proto.OP_ACQUIRE
        r = await f.next()
        assert (r.op, r.id, r.key) == (proto.OP_RELEASE, 777, "late-grant")
    await f.close()


async def test_timeout_and_busy_definitive() -> None:
    """T and B before the caller's deadline are definitive; after it, the
    caller has had its Timeout, and the late answer changes nothing."""

    def handler(fc: FConn, r: FReq) -> None:
        kb = r.key.encode()
        frame = proto.encode_timeout(r.id, kb) if r.key.startswith("t") else proto.encode_busy(r.id, kb)
        asyncio.get_running_loop().call_later(0.4 if r.key.endswith("late") else 0.05, fc.send, frame)

    f = await Fake(handler).start()
    async with fast(f.addr) as c:
        with pytest.raises(lockd.Timeout):
            await c.acquire("t", wait=0.2)
        with pytest.raises(lockd.Busy):
            await c.acquire("b", wait=0.2)
        for key in ("t-late", "b-late"):
            with pytest.raises(lockd.Timeout):
                await c.acquire(key, wait=0.2)
        await asyncio.sleep(0.3)  # the late answers arrive
        assert c.live_connections() == 2
        f.drain()
        await f.none(0.1)
    await f.close()


async def test_cancel() -> None:
    """Cancelled before the send: nothing is sent. After a possible send:
    the connection stays (its answer is awaited in the background)."""
    addr = dead_addr()
    async with fast(addr) as c:
        task = asyncio.ensure_future(c.acquire("ctx", wait=5))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        f = await Fake().start(addr)
        await up(c, 2)
        await f.none(0.2)
        await f.close()
    f = await Fake(silent).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await c.acquire("ctx", wait=5)
        r = await f.next()
        await asyncio.sleep(0.3)
        assert not r.conn.closed.is_set() and c.live_connections() == 2, "the cancellation closed the connection"
    await f.close()


async def test_release_retries_on_another_connection() -> None:
    """A release whose connection drops is sent again after the retry
    interval (200 ms by default), on another connection."""
    n = 0

    def handler(fc: FConn, r: FReq) -> None:
        nonlocal n
        if r.op == proto.OP_RELEASE:
            n += 1
            if n == 1:
                fc.close()
                return
        fc.auto(r)

    f = await Fake(handler).start()
    async with lockd.Client([f.addr], reconnect_interval=0.1) as c:
        await up(c, 2)
        await c.release(lockd.Lock("rel", 42, 0))
        a, b = await f.next(), await f.next()
        assert (a.op, a.id, b.op, b.id) == (proto.OP_RELEASE, 42, proto.OP_RELEASE, 42)
        assert b.at - a.at >= 0.2, f"retried after {b.at - a.at:.3f} s, before 200 ms"
        assert a.conn is not b.conn, "retried on the dropped connection"
    await f.close()


@pytest.mark.timeout(40)
async def test_release_retries_for_5s() -> None:
    """With every attempt lost, release keeps trying for 5 s (default) at
    200 ms, then Indeterminate."""

    def drop(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_RELEASE:
            fc.close()

    f = await Fake(drop).start()
    async with lockd.Client([f.addr], reconnect_interval=0.05) as c:
        await up(c, 2)
        start = time.monotonic()
        with pytest.raises(lockd.Indeterminate):
            await c.release(lockd.Lock("rel", 43, 0))
        el = time.monotonic() - start
        assert 4.9 <= el <= 5.6, f"gave up after {el:.2f} s"
        rs = f.drain()
        assert 10 <= len(rs) <= 26, f"{len(rs)} attempts in 5 s at 200 ms"
        gaps = [b.at - a.at for a, b in zip(rs, rs[1:])]
        assert min(gaps) >= 0.19, f"an attempt after {min(gaps):.3f} s"
    await f.close()


async def test_release_not_held_after_maybe_executed_is_success() -> None:
    """An earlier attempt that may have executed makes a later N a success."""
    n = 0

    def handler(fc: FConn, r: FReq) -> None:
        nonlocal n
        n += 1
        if n == 1:
            fc.close()  # read: it may have executed
            return
        fc.send(proto.encode_not_held(proto.OP_RELEASE, r.id, r.key.encode()))

    f = await Fake(handler).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        await c.release(lockd.Lock("k", 5, 0))
        with pytest.raises(lockd.NotHeld):
            await c.release(lockd.Lock("k", 6, 0))
    await f.close()


async def test_release_no_connection() -> None:
    async with fast(dead_addr(), release_retry=0.5) as c:
        start = time.monotonic()
        with pytest.raises(lockd.NoConnection):
            await c.release(lockd.Lock("k", 1, 0))
        assert time.monotonic() - start >= 0.5


async def test_release_pipelined() -> None:
    """40 releases in flight at once, answered in reverse, each its own
    answer: R, or N for the token the server says is not held."""
    n = 40
    got: list[FReq] = []

    def reverse(fc: FConn, r: FReq) -> None:
        got.append(r)
        if len(got) == n:
            fc.send(
                b"".join(
                    proto.encode_not_held(proto.OP_RELEASE, q.id, q.key.encode())
                    if q.id == 7
                    else proto.encode_released(q.id, q.key.encode())
                    for q in reversed(got)
                )
            )

    f = await Fake(reverse).start()
    async with fast(f.addr, conns_per_addr=1) as c:
        await up(c, 1)
        res = await asyncio.gather(
            *(c.release(lockd.Lock(f"k{i}", i + 1, 0)) for i in range(n)), return_exceptions=True
        )
        for i, r in enumerate(res):
            if i + 1 == 7:
                assert isinstance(r, lockd.NotHeld)
            else:
                assert r is None, r
    await f.close()


async def test_abandoned_renew_answer_not_reused() -> None:
    """A renew given up on after it was sent leaves its answer outstanding;
    that late K must not be taken as the answer of the next renew of the
    same token on the same connection, which the server answers N."""
    n = 0

    def handler(fc: FConn, r: FReq) -> None:
        nonlocal n
        if r.op != proto.OP_RENEW:
            fc.auto(r)
            return
        n += 1
        loop = asyncio.get_running_loop()
        if n == 1:
            loop.call_later(0.15, fc.send, proto.encode_renewed(r.id, r.key.encode()))
        else:
            loop.call_later(0.3, fc.send, proto.encode_not_held(proto.OP_RENEW, r.id, r.key.encode()))

    f = await Fake(handler).start()
    async with fast(f.addr, conns_per_addr=1) as c:
        await up(c, 1)
        lk = lockd.Lock("renewed", 99, 0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await c.renew(lk, 1)
        with pytest.raises(lockd.NotHeld):
            await c.renew(lk, 30)
        assert c.live_connections() == 1
    await f.close()


async def test_moved_without_address_drops_preference() -> None:
    """A redirect to a node that then answers M without an address: that node
    stops being preferred, and after the pause the request goes back to the
    first node, which grants."""
    lost = await Fake(lambda fc, r: fc.send(proto.encode_moved(r.op, r.id, b"")) if r.op == proto.OP_ACQUIRE else fc.auto(r)).start()
    first = [True]

    def node_h(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_ACQUIRE and first[0]:
            first[0] = False
            fc.send(proto.encode_moved(r.op, r.id, lost.addr.encode()))
            return
        grant_777(fc, r)

    node = await Fake(node_h).start()
    async with fast(node.addr, conns_per_addr=1) as c:
        await up(c, 1)
        lk = await c.acquire("moved", wait=2)
        assert lk.token == 777 and len(lost.conns) > 0
        assert pool(c).preferred == "", "still preferring the node that knows no active"
    await lost.close()
    await node.close()


async def test_cluster_finds_active_and_stays() -> None:
    """Given every member, the client learns the active from the first M and
    sends everything there until the active answers M itself (a handoff) or
    dies; then it finds the next one."""
    active = [""]
    ms: list[Fake] = []

    def member(fc: FConn, r: FReq) -> None:
        me = f"127.0.0.1:{fc.writer.get_extra_info('sockname')[1]}"
        if active[0] == me:
            fc.auto(r)
        else:
            fc.send(proto.encode_moved(r.op, r.id, active[0].encode()))

    for _ in range(3):
        ms.append(await Fake(member).start())
    active[0] = ms[2].addr
    async with fast(*(m.addr for m in ms)) as c:
        await up(c, 3)

        async def pairs(prefix: str, n: int) -> None:
            for _ in range(n):
                lk = await c.acquire(prefix, wait=2)
                await c.release(lk)

        def counts() -> list[int]:
            return [len(m.drain()) for m in ms]

        await pairs("stay", 30)
        n = counts()
        assert n[0] + n[1] <= 1 and n[2] == 60, n
        active[0] = ms[0].addr  # handoff: the active answers M naming member 0
        await pairs("handoff", 30)
        n = counts()
        assert n == [60, 0, 1], n
        active[0] = ms[1].addr  # member 0 dies, member 1 takes over
        await ms[0].close()
        await wait_for("the dead active seen", lambda: c.live_connections() == 2)
        await pairs("failover", 30)
        n = counts()
        assert n[1] >= 60 and n[2] <= 1, n
    for m in ms[1:]:
        await m.close()


async def test_redirect_slots_bounded() -> None:
    """A chain of M answers naming ever-new addresses keeps at most
    MAX_REDIRECT_ADDRS of them connected; the request follows every hop with
    one owner; the evicted ones' connections close."""
    hops = 3 * lockd.MAX_REDIRECT_ADDRS
    last = await Fake().start()
    chain = [last]
    nxt = last.addr
    for _ in range(hops):
        to = nxt.encode()
        f = await Fake(lambda fc, r, to=to: fc.send(proto.encode_moved(r.op, r.id, to))).start()
        chain.append(f)
        nxt = f.addr
    head = chain[-1]
    async with fast(head.addr, conns_per_addr=1) as c:
        lk = await c.acquire("hops", wait=10)
        owner = (await head.next()).id
        for i, f in enumerate(chain[:-1]):
            assert (await f.next()).id == owner, f"hop {i}"
        assert len(pool(c).slots) <= 1 + lockd.MAX_REDIRECT_ADDRS
        await wait_for("evicted connections closed", lambda: sum(f.open_conns() for f in chain) <= 1 + lockd.MAX_REDIRECT_ADDRS)
        await c.release(lk)
    for f in chain:
        await f.close()


async def test_close() -> None:
    """Pending calls fail with Closed (a possibly sent acquire with
    ClosedIndeterminate); later calls too; close is idempotent."""
    f = await Fake(silent).start()
    c = fast(f.addr)
    await up(c, 2)
    sent = asyncio.ensure_future(c.acquire("pending", wait=10))
    await f.next()
    dead = fast(dead_addr())
    waiting = asyncio.ensure_future(dead.acquire("waiting", wait=10))
    rel = asyncio.ensure_future(c.release(lockd.Lock("r", 5, 0)))
    ren = asyncio.ensure_future(c.renew(lockd.Lock("k", 6, 0), 1))
    await f.next()
    await f.next()
    await asyncio.sleep(0.1)
    await c.close()
    await dead.close()
    with pytest.raises(lockd.ClosedIndeterminate):
        await sent
    with pytest.raises(lockd.Closed) as ei:
        await waiting
    assert not isinstance(ei.value, lockd.Indeterminate)
    for t in (rel, ren):
        with pytest.raises(lockd.Closed):
            await t
    with pytest.raises(lockd.Closed):
        await c.acquire("after")
    with pytest.raises(lockd.Closed):
        await c.release(lockd.Lock("k", 1, 0))
    await c.close()
    await f.close()


async def test_fail_fast() -> None:
    """fail_fast: with no server reached yet, a call fails as soon as every
    address has failed once."""
    async with fast(dead_addr(), fail_fast=True) as c:
        start = time.monotonic()
        with pytest.raises(lockd.NoConnection):
            await c.acquire("k", wait=10)
        assert time.monotonic() - start < 2


async def test_rejected_is_the_reason() -> None:
    """A server that accepts and closes at once (lockd at --max-conns): the
    call's NoConnection carries Rejected."""

    async def slam(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.transport.abort()

    srv = await asyncio.start_server(slam, "127.0.0.1", 0)
    addr = f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    async with fast(addr, fail_fast=True, transport_timeout=5) as c:
        start = time.monotonic()
        with pytest.raises(lockd.NoConnection) as ei:
            await c.ping()
        assert time.monotonic() - start < 3
        assert isinstance(ei.value.cause, lockd.Rejected) and "--max-conns" in str(ei.value), ei.value
    async with fast(addr, transport_timeout=0.5) as c:  # without fail_fast: the same reason at the deadline
        with pytest.raises(lockd.NoConnection) as ei:
            await c.ping()
        assert isinstance(ei.value.cause, lockd.Rejected), ei.value
    srv.close()
    await srv.wait_closed()


async def test_invalid_arguments_sent_nothing() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        for key in ("", "a\nb", "k" * 1025, "\ud800"):
            with pytest.raises(lockd.InvalidKey):
                await c.acquire(key, wait=1)
        assert len(("é" * 512).encode()) == 1024
        await c.acquire("é" * 512, wait=1)  # the longest key
        for wait in (-1, 256):
            with pytest.raises(lockd.InvalidWait):
                await c.acquire("k", wait=wait)
        for lease in (0, -1, 256):
            with pytest.raises(lockd.InvalidLease):
                await c.acquire("k", wait=1, lease=lease)
        assert (await f.next()).key == "é" * 512
        await f.none(0.1)
    with pytest.raises(lockd.InvalidArgument):
        lockd.Client([])
    with pytest.raises(lockd.InvalidArgument):
        lockd.Client(["nohost"])
    with pytest.raises(lockd.InvalidArgument):
        lockd.Client("127.0.0.1:7070")  # type: ignore[arg-type]
    await f.close()


async def test_lease_rounded_up_and_expires_conservative() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        before = asyncio.get_running_loop().time()
        lk = await c.acquire("lease", wait=1, lease=2.5)
        after = asyncio.get_running_loop().time()
        assert (await f.next()).lease == 3
        assert before + 3 <= lk.expires <= after + 3, "expires is the send instant plus the lease"
        lk2 = await c.renew(lk, 10)
        assert (await f.next()).lease == 10 and lk2.expires >= after + 10
    await f.close()


async def test_renewal_attempt_moves_on_with_the_lease() -> None:
    """A renewal the preferred member does not answer within a quarter of
    the lease goes to another member, which answers; the silent member's
    connection stays until the transport timeout passes without an answer,
    and is closed then."""
    frozen = await Fake(lambda fc, r: None if r.op == proto.OP_RENEW else fc.auto(r)).start()
    other = await Fake(lambda fc, r: fc.send(proto.encode_moved(r.op, r.id, frozen.addr.encode())) if r.op == proto.OP_ACQUIRE else fc.auto(r)).start()
    async with fast(other.addr, frozen.addr, conns_per_addr=1, transport_timeout=2.0) as c:
        await up(c, 2)
        lk = await c.acquire("moves-on", wait=1, lease=2)  # M from other: frozen is preferred
        assert pool(c).preferred == frozen.addr
        frozen.drain()
        other.drain()
        loop = asyncio.get_running_loop()
        start = loop.time()
        lk2 = await c.renew(lk)
        el = loop.time() - start
        assert 0.5 <= el < 1.0, f"renewed after {el:.2f} s, want the 0.5 s attempt timeout and a resend"
        assert lk2.lease == 2
        stuck = await frozen.next()
        assert stuck.op == proto.OP_RENEW and (await other.next()).id == stuck.id
        assert not stuck.conn.closed.is_set(), "the attempt timeout closed the connection"
        await asyncio.wait_for(stuck.conn.closed.wait(), 3)
        assert loop.time() - stuck.at >= 1.9, "closed before the transport timeout"
    await frozen.close()
    await other.close()
