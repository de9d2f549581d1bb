"""PROTOCOL.md §9 against the scripted fake server, where every answer and
fault can be placed exactly: acquire shared under §7's rules, validate,
watch and its pushed ``L``, inspect, E 7 and E 8, every held lock watched
(reasons 1–4, the watch registered again, the bound of watches), and a
server without §9 (E 1)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import lockd
from harness import Fake, FConn, FReq, pool, wait_for
from lockd import proto


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


def no_answer(fc: FConn, r: FReq) -> None:
    """Answer nothing but pings (a request left queued on the server)."""
    if r.op == proto.OP_PING:
        fc.auto(r)


# Acquire shared: §7 as for acquire.


async def test_acquire_shared_frame_and_grant() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        lk = await c.acquire_shared("sem/a", 4, wait=2.5, lease=7)
        r = await f.next()
        assert (r.op, r.wait, r.lease, r.limit, r.key) == (proto.OP_SHARED, 3, 7, 4, "sem/a")
        assert (lk.key, lk.token, lk.lease, lk.limit) == ("sem/a", f.token, 7, 4)
        lk0 = await c.acquire_shared("sem/b", 65535)
        r = await f.next()
        assert (r.op, r.wait, r.limit) == (proto.OP_SHARED, 0, 65535)
        assert lk0.limit == 65535
        # A shared holder is released by its own token, like any other.
        await c.release(lk)
        r = await f.next()
        assert (r.op, r.id, r.key) == (proto.OP_RELEASE, lk.token, "sem/a")
        assert (await c.acquire("x")).limit == 0
    await f.close()


@pytest.mark.parametrize("limit", [0, 65536, -1, True, 2.0])
async def test_acquire_shared_bad_limit_sends_nothing(limit: Any) -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        with pytest.raises(lockd.InvalidArgument):
            await c.acquire_shared("k", limit)
        with pytest.raises(lockd.InvalidArgument):
            c.semaphore("k", limit)
        await f.none(0.1)
    await f.close()


async def test_acquire_shared_timeout_busy_definitive() -> None:
    def answer(fc: FConn, r: FReq) -> None:
        kb = r.key.encode()
        if r.key == "t":
            fc.send(proto.encode_timeout(r.id, kb))
        elif r.key == "b":
            fc.send(proto.encode_busy(r.id, kb))
        else:
            fc.auto(r)

    f = await Fake(answer).start()
    async with fast(f.addr) as c:
        with pytest.raises(lockd.Timeout):
            await c.acquire_shared("t", 2, wait=1)
        with pytest.raises(lockd.Busy):
            await c.acquire_shared("b", 2, wait=1)
        assert len(f.drain()) == 2, "T and B are definitive: nothing is sent again"
    await f.close()


async def test_limit_mismatch_is_definitive_and_keeps_the_connection() -> None:
    def answer(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_SHARED:
            fc.send(proto.encode_error(r.op, r.id, proto.CODE_LIMIT_MISMATCH, b"limit mismatch: the key's holders have limit 4"))
        else:
            fc.auto(r)

    f = await Fake(answer).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        with pytest.raises(lockd.LimitMismatch) as ei:
            await c.acquire_shared("sem", 5, wait=2)
        assert (ei.value.key, ei.value.limit) == ("sem", 5)
        assert "limit 4" in str(ei.value)
        await asyncio.sleep(0.1)
        assert len(f.drain()) == 1, "E 7 is not sent again"
        assert c.live_connections() == 2 and f.open_conns() == 2
        await c.ping()
    await f.close()


async def test_acquire_shared_follows_moved_with_the_same_owner() -> None:
    active = await Fake().start()
    standby = await Fake(lambda fc, r: fc.send(proto.encode_moved(r.op, r.id, active.addr.encode()))).start()
    async with fast(standby.addr) as c:
        lk = await c.acquire_shared("sem", 3, wait=5)
        r1, r2 = await standby.next(), await active.next()
        assert (r1.op, r2.op) == (proto.OP_SHARED, proto.OP_SHARED)
        assert (r2.id, r2.limit, r2.key) == (r1.id, 3, "sem")
        assert lk.token == active.token
    for x in (active, standby):
        await x.close()


async def test_acquire_shared_late_grant_released() -> None:
    """The caller's deadline decides (decision 39) for S as for A: Timeout
    at the deadline, the connection kept, a later grant released by its
    exact token."""
    late: list[FReq] = []

    def answer(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_SHARED:
            late.append(r)
            asyncio.get_running_loop().call_later(0.5, fc.send, proto.encode_acquired(r.id, 4242, r.key.encode()))
        else:
            fc.auto(r)

    f = await Fake(answer).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        t0 = time.monotonic()
        with pytest.raises(lockd.Timeout):
            await c.acquire_shared("late", 2, wait=0.2)
        assert time.monotonic() - t0 < 0.4
        assert (await f.next()).op == proto.OP_SHARED
        rel = await f.next(timeout=3)
        assert (rel.op, rel.id, rel.key) == (proto.OP_RELEASE, 4242, "late")
        assert c.live_connections() == 2
    await f.close()


async def test_acquire_shared_cancelled_keeps_the_connection() -> None:
    f = await Fake(no_answer).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        t = asyncio.ensure_future(c.acquire_shared("cancel", 2, wait=30))
        r = await f.next()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        # The late grant is released; nothing else on the connection fails.
        r.conn.send(proto.encode_acquired(r.id, 99, b"cancel"))
        rel = await f.next()
        assert (rel.op, rel.id) == (proto.OP_RELEASE, 99)
        assert c.live_connections() == 2
    await f.close()


# Validate and inspect.


async def test_validate() -> None:
    def answer(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_VALIDATE:
            if r.id == 7:
                fc.send(proto.encode_valid(r.id, 12345, r.key.encode()))
            else:
                fc.send(proto.encode_not_held(proto.OP_VALIDATE, r.id, r.key.encode()))
        else:
            fc.auto(r)

    f = await Fake(answer).start()
    async with fast(f.addr) as c:
        assert await c.validate("jobs/a", 7) == 12.345
        r = await f.next()
        assert (r.op, r.id, r.key) == (proto.OP_VALIDATE, 7, "jobs/a")
        assert await c.validate(lockd.Lock("jobs/a", 7, 0.0)) == 12.345
        with pytest.raises(lockd.NotHeld):
            await c.validate("jobs/a", 8)
        with pytest.raises(lockd.InvalidArgument):
            await c.validate("jobs/a")  # type: ignore[call-overload]
        with pytest.raises(lockd.InvalidArgument):
            await c.validate("jobs/a", -1)
    await f.close()


async def test_validate_sent_again_after_a_lost_connection() -> None:
    """V changes nothing: a connection lost under it sends it again on
    another, and the caller gets the answer."""
    first: list[FConn] = []

    def answer(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_VALIDATE and not first:
            first.append(fc)
            fc.close()
        else:
            fc.auto(r)

    f = await Fake(answer).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        assert await c.validate("k", 3) == 30.0
        r1, r2 = await f.next(), await f.next()
        assert (r1.op, r2.op, r2.id) == (proto.OP_VALIDATE, proto.OP_VALIDATE, 3)
        assert r1.conn is not r2.conn
    await f.close()


async def test_validate_and_inspect_follow_moved() -> None:
    active = await Fake().start()
    standby = await Fake(lambda fc, r: fc.send(proto.encode_moved(r.op, r.id, active.addr.encode()))).start()
    async with fast(standby.addr) as c:
        assert await c.validate("k", 5) == 30.0
        assert (await c.inspect("k")).free
        assert [r.op for r in (await active.next(), await active.next())] == [proto.OP_VALIDATE, proto.OP_INSPECT]
    for x in (active, standby):
        await x.close()


async def test_inspect() -> None:
    def answer(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_INSPECT:
            fc.send(proto.encode_inspection(r.id, 3, 4, 2, 1007, 12500, r.key.encode()))
        else:
            fc.auto(r)

    f = await Fake(answer).start()
    async with fast(f.addr) as c:
        got = await c.inspect("sem/workers")
        assert got == lockd.Inspection("sem/workers", 3, 4, 2, 1007, 12.5)
        assert not got.free
        r = await f.next()
        assert (r.op, r.key) == (proto.OP_INSPECT, "sem/workers")
    await f.close()


async def test_queries_without_an_answer_time_out() -> None:
    """A member that answers nothing costs the transport timeout, then
    Timeout (lockd was reached) — never a value."""
    f = await Fake(no_answer).start()
    async with fast(f.addr, transport_timeout=0.5) as c:
        await up(c, 2)
        t0 = time.monotonic()
        with pytest.raises(lockd.Timeout):
            await c.validate("k", 1)
        assert time.monotonic() - t0 < 1.5
    await f.close()


# Watch.


@pytest.mark.parametrize("reason", [1, 2, 3])
async def test_watch_ends_with_the_reason_of_its_L(reason: int) -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        w = await c.watch("jobs/a", 1001)
        r = await f.next_watch()
        assert (r.op, r.id, r.key) == (proto.OP_WATCH, 1001, "jobs/a")
        assert not w.done() and w.reason is None
        assert f.push_lost(1001, reason) == 1
        assert await asyncio.wait_for(w, 1) is lockd.Reason(reason)
        assert w.reason is lockd.Reason(reason) and w.error is None
        assert [x async for x in w] == [lockd.Reason(reason)], "the async iterator yields the one end"
        assert c.live_connections() == 2
        assert len(f.watch_reqs) == 1
    await f.close()


@pytest.mark.parametrize("lapse", ["L 4", "connection lost", "unknown reason"])
async def test_watch_registers_again_when_it_lapses(lapse: str) -> None:
    """The member can no longer tell (L 4; an L reason the client does not
    know counts the same), or the connection is lost: the grant may live
    on, and the watch registers again — on another connection for a lost
    one — and ends with the next L."""
    f = await Fake().start()
    async with fast(f.addr) as c:
        await up(c, 2)
        w = await c.watch("k", 5)
        r1 = await f.next_watch()
        if lapse == "connection lost":
            r1.conn.close()
        else:
            f.push_lost(5, 4 if lapse == "L 4" else 9)
        r2 = await f.next_watch()
        assert (r2.id, r2.key) == (5, "k")
        if lapse == "connection lost":
            assert r2.conn is not r1.conn
        assert not w.done()
        f.push_lost(5, 2)
        assert await asyncio.wait_for(w, 1) is lockd.Reason.EXPIRED
    await f.close()


async def test_watch_ends_not_held_when_the_grant_is_gone_after_a_lapse() -> None:
    """Registered again after an L 4 and answered N: the grant ended while
    no one could tell how — the watch ends with NotHeld."""
    n = 0

    def watch(fc: FConn, r: FReq) -> None:
        nonlocal n
        n += 1
        if n == 1:
            fc.auto(r)
        else:
            fc.send(proto.encode_not_held(proto.OP_WATCH, r.id, r.key.encode()))

    f = await Fake(watch=watch).start()
    async with fast(f.addr) as c:
        w = await c.watch("k", 5)
        f.push_lost(5, 4)
        with pytest.raises(lockd.NotHeld):
            await asyncio.wait_for(w, 1)
        assert isinstance(w.error, lockd.NotHeld) and w.reason is None
    await f.close()


async def test_a_watch_that_keeps_lapsing_is_not_asked_in_a_loop() -> None:
    """A member that answers every W and says at once it cannot tell (L 4)
    is asked again only every retry_pause, not in a tight loop."""

    def watch(fc: FConn, r: FReq) -> None:
        fc.send(proto.encode_watching(r.id, r.key.encode()) + proto.encode_lost(r.id, 4, r.key.encode()))

    f = await Fake(watch=watch).start()
    async with fast(f.addr, retry_pause=0.1) as c:
        w = await c.watch("k", 5)
        await asyncio.sleep(0.55)
        n = len(f.watch_reqs)
        assert 3 <= n <= 8, f"{n} watches in 0.55 s with a 0.1 s pause"
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        await asyncio.sleep(0.2)
        assert len(f.watch_reqs) <= n + 1, "a cancelled watch registers no more"
    await f.close()


async def test_watch_of_a_lock_and_a_held_lock() -> None:
    f = await Fake().start()
    async with fast(f.addr, watch_locks=False) as c:
        lk = await c.acquire("k")
        w = await c.watch(lk)
        assert (w.key, w.token) == ("k", lk.token)
        held = await c.keep_alive(lk)
        w2 = await c.watch(held)
        assert (w2.key, w2.token) == ("k", lk.token)
        await held.stop()
    await f.close()


async def test_watch_not_held() -> None:
    f = await Fake(watch=lambda fc, r: fc.send(proto.encode_not_held(proto.OP_WATCH, r.id, r.key.encode()))).start()
    async with fast(f.addr) as c:
        with pytest.raises(lockd.NotHeld):
            await c.watch("k", 5)
        conns = pool(c).slots
        assert sum(s.conn.nreg + s.conn.wflight for s in conns if s.conn is not None) == 0
    await f.close()


async def test_two_watches_of_one_grant_each_end() -> None:
    f = await Fake().start()
    async with fast(f.addr, conns_per_addr=1) as c:
        w1 = await c.watch("k", 5)
        w2 = await c.watch("k", 5)
        assert f.push_lost(5, 2) == 2
        assert await asyncio.wait_for(asyncio.gather(w1.wait(), w2.wait()), 1) == [lockd.Reason.EXPIRED] * 2
        c1 = pool(c).slots[0].conn
        assert c1 is not None and (c1.nreg, c1.wflight) == (0, 0)
    await f.close()


async def test_watch_limit_is_definitive_and_learnt() -> None:
    """E 8 on one connection: the watch goes to the other one, which has
    room; once every connection said E 8, WatchLimit, at once and without
    asking again, and the connections stay."""
    full: set[int] = set()

    def watch(fc: FConn, r: FReq) -> None:
        if id(fc) in full:
            fc.send(proto.encode_error(r.op, r.id, proto.CODE_LIMIT_REACHED, b"too many watches on this connection"))
        else:
            full.add(id(fc))
            fc.auto(r)

    f = await Fake(watch=watch).start()
    async with fast(f.addr) as c:
        await up(c, 2)
        ws = [await c.watch("k", t) for t in (1, 2)]  # one on each connection
        assert len({id(r.conn) for r in f.watch_reqs}) == 2
        n = len(f.watch_reqs)
        with pytest.raises(lockd.WatchLimit):
            await c.watch("k", 3)
        assert len(f.watch_reqs) == n + 2, "one E 8 from each connection, then the client knew"
        with pytest.raises(lockd.WatchLimit):
            await c.watch("k", 4)
        assert len(f.watch_reqs) == n + 2, "the bound was learnt: nothing sent"
        assert c.live_connections() == 2
        # An L frees a place.
        f.push_lost(1, 1)
        assert await ws[0] is lockd.Reason.RELEASED
        full.clear()
        await c.watch("k", 5)
    await f.close()


# Every held lock is watched.


@pytest.mark.parametrize("reason", [1, 2, 3])
async def test_held_lock_lost_at_once_on_L(reason: int) -> None:
    """An L (released, expired, forced) sets ``lost`` the moment it is read
    — not at the next renewal — cancels the block with LockLost, whose
    ``ended`` says which, and sends no release (the grant is gone)."""
    f = await Fake().start()
    async with fast(f.addr) as c:
        lost_at: list[float] = []
        with pytest.raises(lockd.LockLost) as ei:
            async with c.lock("held", wait=1, lease=30) as held:
                held.add_lost_callback(lambda _e: lost_at.append(time.monotonic()))
                w = await f.next_watch()
                assert (w.id, w.key) == (held.token, "held")
                sent = time.monotonic()
                assert f.push_lost(held.token, reason) == 1
                await asyncio.sleep(30)  # cancelled when the lock is lost
        assert lost_at and lost_at[0] - sent < 0.1, "lost set late"
        assert ei.value.ended is lockd.Reason(reason)
        assert isinstance(ei.value.reason, lockd.GrantEnded) and isinstance(ei.value.reason, lockd.NotHeld)
        assert ei.value.reason.reason is lockd.Reason(reason)
        reqs = [r.op for r in f.drain()]
        assert reqs == [proto.OP_ACQUIRE], f"no renewal, no release: {[chr(o) for o in reqs]}"
    await f.close()


async def test_keep_alive_lost_on_L() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        held = await c.keep_alive(await c.acquire("k", lease=30))
        await f.next_watch()
        f.push_lost(held.token, 2)
        await asyncio.wait_for(held.lost.wait(), 1)
        assert held.error is not None and held.error.ended is lockd.Reason.EXPIRED
        assert await held.stop() is held.error
    await f.close()


async def test_held_lock_watched_again_after_L4() -> None:
    """L 4 (the member can no longer tell) loses nothing: the lock renews
    at once — not at its next renewal, 10 s away — and the watch is
    registered again; an L there ends the lock."""
    f = await Fake().start()
    async with fast(f.addr) as c:
        held = await c.keep_alive(await c.acquire("k", lease=30))
        assert (await f.next()).op == proto.OP_ACQUIRE
        await f.next_watch()
        f.push_lost(held.token, 4)
        k = await f.next(timeout=1)
        assert (k.op, k.id, k.lease) == (proto.OP_RENEW, held.token, 30)
        w2 = await f.next_watch()
        assert (w2.id, w2.key) == (held.token, "k")
        await asyncio.sleep(0.05)
        assert not held.lost.is_set()
        f.push_lost(held.token, 3)
        await asyncio.wait_for(held.lost.wait(), 1)
        assert held.error is not None and held.error.ended is lockd.Reason.FORCED
    await f.close()


async def test_held_lock_watched_again_after_a_lost_connection() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        await up(c, 2)
        held = await c.keep_alive(await c.acquire("k", lease=30))
        f.drain()
        w1 = await f.next_watch()
        w1.conn.close()
        w2 = await f.next_watch()
        assert w2.conn is not w1.conn and w2.id == held.token
        assert (await f.next(timeout=1)).op == proto.OP_RENEW, "renewed at once"
        assert not held.lost.is_set()
        await held.stop()
    await f.close()


async def test_held_lock_lost_when_watched_again_and_not_held() -> None:
    """After L 4 the watch asks where the key is served now: its N (the
    grant did not survive the failover) loses the lock at once."""
    n = 0

    def watch(fc: FConn, r: FReq) -> None:
        nonlocal n
        n += 1
        if n == 1:
            fc.auto(r)
        else:
            fc.send(proto.encode_not_held(proto.OP_WATCH, r.id, r.key.encode()))

    f = await Fake(watch=watch).start()
    async with fast(f.addr) as c:
        held = await c.keep_alive(await c.acquire("k", lease=30))
        await f.next_watch()
        f.push_lost(held.token, 4)
        await asyncio.wait_for(held.lost.wait(), 1)
        assert held.error is not None and isinstance(held.error.reason, lockd.NotHeld)
        assert held.error.ended is None
    await f.close()


async def test_own_release_is_no_loss(caplog: pytest.LogCaptureFixture) -> None:
    """The L 1 that follows the block's own release is not a lost lock."""
    caplog.set_level(logging.INFO, logger="lockd")

    def rel(fc: FConn, r: FReq) -> None:
        fc.auto(r)
        if r.op == proto.OP_RELEASE:
            fc.fake.push_lost(r.id, 1)

    f = await Fake(rel).start()
    async with fast(f.addr) as c:
        async with c.lock("k", wait=1) as held:
            await f.next_watch()
        assert held.error is None
        await asyncio.sleep(0.05)
    assert not [r for r in caplog.records if "lost" in r.getMessage()], caplog.records
    await f.close()


async def test_unwatched_lock_is_kept_by_its_renewals(caplog: pytest.LogCaptureFixture) -> None:
    """Every connection refused the watch (E 8): the lock is left to its
    renewals — held, renewed, said once at WARNING — and its watch is tried
    again a renewal interval later, without asking a connection that has
    not seen one of its watches end since its E 8."""
    caplog.set_level(logging.DEBUG, logger="lockd")
    room = False

    def watch(fc: FConn, r: FReq) -> None:
        if room:
            fc.auto(r)
        else:
            fc.send(proto.encode_error(r.op, r.id, proto.CODE_LIMIT_REACHED, b"too many watches on this connection"))

    f = await Fake(watch=watch).start()
    async with fast(f.addr, conns_per_addr=1) as c:
        held = await c.keep_alive(await c.acquire("k", lease=3))
        await f.next_watch()
        await wait_for("the warning", lambda: any("not watched" in r.getMessage() for r in caplog.records))
        await asyncio.sleep(2.2)  # two more tries, a renewal interval (1 s) apart
        warns = [r for r in caplog.records if r.levelno == logging.WARNING and "not watched" in r.getMessage()]
        assert len(warns) == 1, warns
        assert len(f.watch_reqs) == 1, "the connection that said E 8 was asked again"
        conn = pool(c).slots[0].conn
        assert conn is not None and conn.watch_bound == 0
        # A new connection knows no bound: the next try watches there.
        room = True
        conn.fail(ConnectionError("test: replace the connection"))
        w = await f.next_watch(timeout=3)
        assert w.id == held.token
        assert not held.lost.is_set()
        await held.stop()
    await f.close()


async def test_watch_locks_false_sends_no_watch() -> None:
    f = await Fake().start()
    async with fast(f.addr, watch_locks=False) as c:
        async with c.lock("k", wait=1, lease=1):
            await asyncio.sleep(0.6)  # a renewal
        assert f.watch_reqs == []
    await f.close()


def test_sync_held_lock_lost_on_L() -> None:
    async def start() -> Fake:
        return await Fake().start()

    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        f = asyncio.run_coroutine_threadsafe(start(), loop).result(5)
        with lockd.SyncClient([f.addr], reconnect_interval=0.1) as c:
            with pytest.raises(lockd.LockLost) as ei:
                with c.lock("sync", wait=1, lease=30) as held:
                    deadline = time.monotonic() + 2
                    while not f.watch_reqs and time.monotonic() < deadline:
                        time.sleep(0.005)
                    sent = time.monotonic()
                    loop.call_soon_threadsafe(f.push_lost, held.token, 2)
                    assert held.lost.wait(2)
                    assert time.monotonic() - sent < 0.1
                    with pytest.raises(lockd.LockLost):
                        held.check()
            assert ei.value.ended is lockd.Reason.EXPIRED
            # A watch from a thread.
            lk = c.acquire("sync2")
            w = c.watch(lk)
            assert w.wait(0.05) is None
            loop.call_soon_threadsafe(f.push_lost, lk.token, 1)
            assert w.wait(2) is lockd.Reason.RELEASED
            assert list(w) == [lockd.Reason.RELEASED]
            assert c.validate(lk) == 30.0
            assert c.inspect("sync2").free
            assert c.acquire_shared("s", 3).limit == 3
        asyncio.run_coroutine_threadsafe(f.close(), loop).result(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
        loop.close()


# A server without §9.


def old_server(fc: FConn, r: FReq) -> None:
    """lockd before §9: an unknown op is E 1 (op as read, id 0) and the
    connection closes; acquires with a wait stay queued."""
    if r.op in (proto.OP_SHARED, proto.OP_VALIDATE, proto.OP_WATCH, proto.OP_INSPECT):
        fc.send(proto.encode_error(r.op, 0, proto.CODE_BAD_FRAME, f"unknown op 0x{r.op:02x}".encode()))
        fc.close()
    elif r.op == proto.OP_ACQUIRE and r.wait > 0:
        pass
    else:
        fc.auto(r)


async def test_server_without_s9() -> None:
    """E 1 to a §9 request: the call raises Unsupported, saying the server
    does not support it; a request written before it on that connection is
    lost and says why; one written after it was never read and is sent on
    another connection; later §9 calls to that server fail at once, without
    costing another connection."""
    f = await Fake(old_server, watch=old_server).start()
    async with fast(f.addr, conns_per_addr=1, watch_locks=False) as c:
        await up(c, 1)
        a = asyncio.ensure_future(c.acquire("queued", wait=5))
        s = asyncio.ensure_future(c.acquire_shared("sem", 2, wait=5))
        p = asyncio.ensure_future(c.ping())  # written after the S
        with pytest.raises(lockd.Unsupported) as ei:
            await s
        assert "does not support acquire-shared" in str(ei.value) and "upgrade" in str(ei.value)
        assert ei.value.addr == f.addr
        with pytest.raises(lockd.Indeterminate) as ea:
            await a
        assert "does not support acquire-shared" in str(ea.value), str(ea.value)
        await asyncio.wait_for(p, 3)
        assert [r.op for r in f.drain()] == [proto.OP_ACQUIRE, proto.OP_SHARED, proto.OP_PING]
        accepted = len(f.conns)
        for call in (c.validate("k", 1), c.inspect("k"), c.watch("k", 1), c.acquire_shared("sem", 2)):
            with pytest.raises(lockd.Unsupported):
                await call
        assert f.drain() == [] and len(f.conns) == accepted, "known unsupported: nothing sent"
        await c.ping()
    await f.close()


async def test_held_locks_against_a_server_without_s9(caplog: pytest.LogCaptureFixture) -> None:
    """The watch of a held lock meets E 1 once: the lock is kept by its
    renewals, it is said at WARNING, and no other lock's watch is sent."""
    caplog.set_level(logging.INFO, logger="lockd")
    f = await Fake(old_server, watch=old_server).start()
    async with fast(f.addr) as c:
        h1 = await c.keep_alive(await c.acquire("a", lease=2))
        await f.next_watch()
        h2 = await c.keep_alive(await c.acquire("b", lease=2))
        await asyncio.sleep(1.0)  # renewals of both
        assert len(f.watch_reqs) == 1
        assert not h1.lost.is_set() and not h2.lost.is_set()
        assert any(r.levelno == logging.WARNING and "does not support watch" in r.getMessage() for r in caplog.records)
        await h1.stop()
        await h2.stop()
    await f.close()


# Semaphores and read/write locks.


async def test_semaphore_and_rw_lock_frames() -> None:
    f = await Fake().start()
    async with fast(f.addr) as c:
        sem = c.semaphore("sem", 5, wait=2, lease=9)
        assert (sem.key, sem.limit) == ("sem", 5)
        entered = asyncio.Event()
        go = asyncio.Event()

        async def hold() -> int:
            async with sem as permit:
                entered.set()
                await go.wait()
                return permit.token

        t1 = asyncio.ensure_future(hold())
        await entered.wait()
        async with sem as p2:
            go.set()
            tok1 = await t1
        assert p2.token != tok1
        reqs = f.drain()
        sh = [r for r in reqs if r.op == proto.OP_SHARED]
        assert [(r.limit, r.wait, r.lease) for r in sh] == [(5, 2, 9)] * 2
        assert sorted(r.id for r in reqs if r.op == proto.OP_RELEASE) == sorted([tok1, p2.token])
        async with sem.acquire(wait=0, lease=3):
            pass
        r = await f.next()
        assert (r.op, r.limit, r.wait, r.lease) == (proto.OP_SHARED, 5, 0, 3)
        f.drain()
        rw = c.rw_lock("rw", wait=1)
        async with rw.read() as rd:
            assert rd.lock.limit == 65535
        async with rw.write() as wr:
            assert wr.lock.limit == 0
        ops = [(r.op, r.limit) for r in f.drain() if r.op != proto.OP_RELEASE]
        assert ops == [(proto.OP_SHARED, 65535), (proto.OP_ACQUIRE, 0)]
    await f.close()


def test_sync_semaphore_and_rw_lock() -> None:
    async def start() -> Fake:
        return await Fake().start()

    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        f = asyncio.run_coroutine_threadsafe(start(), loop).result(5)
        with lockd.SyncClient([f.addr]) as c:
            sem = c.semaphore("sem", 2, wait=1)
            with sem as a:
                with sem as b:
                    assert a.token != b.token and a.lock.limit == 2
            rw = c.rw_lock("rw")
            with rw.read() as rd, rw.read() as rd2:
                assert rd.lock.limit == rd2.lock.limit == 65535
            with rw.write() as wr:
                assert wr.lock.limit == 0
        asyncio.run_coroutine_threadsafe(f.close(), loop).result(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
        loop.close()
