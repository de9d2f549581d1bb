"""Holding a lock: ``async with c.lock()``, ``keep_alive``, the sync facade,
and the fencing helper."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import lockd
from harness import Cluster, Fake, FConn, FReq
from lockd import fence, proto


async def test_lock_block_renews_and_releases(shared_server: Cluster) -> None:
    """The lease is renewed while the block runs longer than it; the key is
    held throughout and free after."""
    async with lockd.Client(shared_server.addrs) as c, lockd.Client(shared_server.addrs) as other:
        async with c.lock("lock/renewed", wait=1, lease=3) as lock:
            assert lock.token > 0 and not lock.lost.is_set()
            for _ in range(5):
                await asyncio.sleep(1)
                with pytest.raises(lockd.Timeout):
                    await other.acquire("lock/renewed")
            assert not lock.lost.is_set()
            assert lock.expires > asyncio.get_running_loop().time()
        lk = await other.acquire("lock/renewed")
        assert lk.token > lock.token
        await other.release(lk)


async def test_lock_lost_cancels_block(shared_server: Cluster) -> None:
    """Someone releases the lock's token (no ACL: a token is enough): the next
    renewal is answered N, lock.lost is set, the block's task is cancelled at
    its await, and the exit raises LockLost."""
    async with lockd.Client(shared_server.addrs) as c, lockd.Client(shared_server.addrs) as other:
        reached = False
        start = time.monotonic()
        with pytest.raises(lockd.LockLost) as ei:
            async with c.lock("lock/lost", wait=1, lease=3) as lock:
                await other.release(lock.lock)
                await asyncio.sleep(10)
                reached = True
        assert not reached, "the block ran on after the loss"
        assert lock.lost.is_set() and lock.error is ei.value
        assert isinstance(ei.value.reason, lockd.NotHeld)
        assert time.monotonic() - start < 3, "lost only after the lease"
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_lock_outside_cancellation_propagates(shared_server: Cluster) -> None:
    """A cancellation from elsewhere is not turned into LockLost; the lock is
    released on the way out."""
    async with lockd.Client(shared_server.addrs) as c:

        async def hold() -> None:
            async with c.lock("lock/cancel", wait=1, lease=30):
                await asyncio.sleep(10)

        t = asyncio.ensure_future(hold())
        await asyncio.sleep(0.2)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        lk = await c.acquire("lock/cancel")  # released
        await c.release(lk)


async def test_lock_block_error_propagates_and_releases(shared_server: Cluster) -> None:
    async with lockd.Client(shared_server.addrs) as c:
        with pytest.raises(ZeroDivisionError):
            async with c.lock("lock/error", wait=1, lease=30):
                1 / 0
        lk = await c.acquire("lock/error")
        await c.release(lk)


async def test_lock_acquire_error_skips_block(shared_server: Cluster) -> None:
    async with lockd.Client(shared_server.addrs) as c:
        lk = await c.acquire("lock/busy", lease=30)
        ran = False
        with pytest.raises(lockd.Timeout):
            async with c.lock("lock/busy", wait=0.5):
                ran = True
        assert not ran
        await c.release(lk)


async def test_keep_alive_lost_at_stop_time() -> None:
    """Renewals that are never answered: the lock is lost when its stop time
    (expires - margin) passes, not later."""

    def handler(fc: FConn, r: FReq) -> None:
        if r.op != proto.OP_RENEW:
            fc.auto(r)

    f = await Fake(handler).start()
    errs: list[BaseException] = []
    async with lockd.Client([f.addr], transport_timeout=0.5, retry_pause=0.05) as c:
        lk = await c.acquire("ka", wait=1, lease=3)
        held = await c.keep_alive(lk, lease=3, margin=0.5, on_renew_error=errs.append)
        stop_by = held.stop_by
        await asyncio.wait_for(held.lost.wait(), 5)
        now = asyncio.get_running_loop().time()
        assert stop_by <= now <= stop_by + 0.3, f"lost {now - stop_by:.2f} s after the stop time"
        assert held.error is not None and held.error.reason is None, "a stop time passed: reason None"
        assert held.error.__cause__ is not None, "the last renewal's error is the cause"
        assert errs, "retried renewal errors are reported"
        assert await held.stop() is held.error
    await f.close()


async def test_keep_alive_renews_first_when_little_is_left() -> None:
    f = await Fake().start()
    async with lockd.Client([f.addr]) as c:
        lk = lockd.Lock("ka", 5, asyncio.get_running_loop().time() + 1)  # 1 s left of a 30 s lease
        held = await c.keep_alive(lk, lease=30)
        r = await f.next()
        assert (r.op, r.lease) == (proto.OP_RENEW, 30), "renewed before returning"
        assert held.expires > lk.expires + 20
        await held.stop()
    await f.close()


async def test_keep_alive_not_held_at_start() -> None:
    f = await Fake(lambda fc, r: fc.send(proto.encode_not_held(proto.OP_RENEW, r.id, r.key.encode()))).start()
    async with lockd.Client([f.addr]) as c:
        with pytest.raises(lockd.LockLost):
            await c.keep_alive(lockd.Lock("ka", 5, 0.0))
    await f.close()


async def test_close_loses_held_locks(shared_server: Cluster) -> None:
    c = lockd.Client(shared_server.addrs)
    lk = await c.acquire("lock/close", wait=1, lease=30)
    held = await c.keep_alive(lk)
    await c.close()
    assert held.lost.is_set() and isinstance(held.error, lockd.LockLost)
    assert isinstance(held.error.reason, lockd.Closed)
    async with lockd.Client(shared_server.addrs) as c2:
        await c2.release(lk)


def test_sync_client(shared_server: Cluster) -> None:
    """The facade runs the same core on a background loop, from any thread."""
    with lockd.SyncClient(shared_server.addrs) as c:
        assert c.ping() < 1
        lk = c.acquire("sync/a", wait=1, lease=10)
        with pytest.raises(lockd.Timeout):
            c.acquire("sync/a")
        c.renew(lk, 20)
        c.release(lk)
        with pytest.raises(lockd.NotHeld):
            c.release(lk)
        results: list[int] = []

        def worker(i: int) -> None:
            for _ in range(20):
                with c.lock(f"sync/t{i % 2}", wait=10, lease=10) as held:
                    results.append(held.token)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(20)
        assert len(set(results)) == 80
    with pytest.raises(lockd.Closed):
        c.ping()


def test_sync_lock_lost(shared_server: Cluster) -> None:
    """A thread cannot be interrupted: lock.lost is set, check() raises, and
    the exit raises LockLost."""
    with lockd.SyncClient(shared_server.addrs) as c, lockd.SyncClient(shared_server.addrs) as other:
        with pytest.raises(lockd.LockLost):
            with c.lock("sync/lost", wait=1, lease=3) as lock:
                other.release(lock.lock)
                assert lock.lost.wait(3), "loss not seen within a renewal interval"
                with pytest.raises(lockd.LockLost):
                    lock.check()


def test_sync_lock_renews(shared_server: Cluster) -> None:
    with lockd.SyncClient(shared_server.addrs) as c:
        with c.lock("sync/renew", wait=1, lease=3) as lock:
            time.sleep(4.5)  # longer than the lease
            lock.check()
            assert lock.expires > time.monotonic()
        c.release(c.acquire("sync/renew"))


def test_fence_checker() -> None:
    ck = fence.Checker()
    ck.check("db", 5)
    ck.check("db", 5)  # the same holder again
    with pytest.raises(fence.StaleToken):
        ck.check("db", 4)
    assert ck.do("db", 9, lambda: "written") == "written"
    with pytest.raises(fence.StaleToken):
        ck.do("db", 8, lambda: pytest.fail("a stale write ran"))
    assert ck.largest("db") == 9 and ck.largest("other") == 0


async def test_fence_async_checker() -> None:
    ck = fence.AsyncChecker()
    order: list[int] = []

    async def write(t: int) -> int:
        await asyncio.sleep(0.01)
        order.append(t)
        return t

    assert await ck.do("db", 3, lambda: write(3)) == 3
    with pytest.raises(fence.StaleToken):
        await ck.do("db", 2, lambda: write(2))
    assert order == [3] and ck.largest("db") == 3
