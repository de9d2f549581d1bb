"""PROTOCOL.md §9 against the real lockd (the binary of this checkout): each
operation, a semaphore that never has more than N holders across many
tasks and clients, the read/write lock (no reader beside a writer; a waiting
writer holds up later readers), a held lock's ``lost`` set by lockd's ``L``
within milliseconds of a forced release or an expiry, and its watch moved
to the new active/leader after an ``L`` 4."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path
from typing import Iterator

import pytest

import lockd
from conftest import cluster_fixture
from harness import Cluster, pool


async def test_each_operation(shared_server: Cluster) -> None:
    async with lockd.Client(shared_server.addrs) as c:
        a = await c.acquire_shared("ops/sem", 2, lease=20)
        b = await c.acquire_shared("ops/sem", 2, lease=10)
        assert (a.limit, b.limit) == (2, 2) and b.token > a.token
        # Full: wait 0 is T; another limit is E 7; an exclusive acquire waits
        # for every holder.
        with pytest.raises(lockd.Timeout):
            await c.acquire_shared("ops/sem", 2)
        with pytest.raises(lockd.LimitMismatch):
            await c.acquire_shared("ops/sem", 3, wait=1)
        with pytest.raises(lockd.Timeout):
            await c.acquire("ops/sem")

        left = await c.validate(a)
        assert 19.0 < left <= 20.0, left
        assert 9.0 < await c.validate("ops/sem", b.token) <= 10.0
        with pytest.raises(lockd.NotHeld):
            await c.validate("ops/sem", b.token + 1000)
        with pytest.raises(lockd.NotHeld):
            await c.validate("ops/other", a.token)

        got = await c.inspect("ops/sem")
        assert (got.key, got.holders, got.limit, got.waiters, got.token) == ("ops/sem", 2, 2, 0, b.token)
        assert 9.0 < got.remaining <= 10.0
        assert (await c.inspect("ops/free")) == lockd.Inspection("ops/free", 0, 0, 0, 0, 0.0)

        # A queued exclusive acquire counts as a waiter.
        t = asyncio.ensure_future(c.acquire("ops/sem", wait=10, lease=5))
        for _ in range(100):
            if (await c.inspect("ops/sem")).waiters == 1:
                break
            await asyncio.sleep(0.01)
        assert (await c.inspect("ops/sem")).waiters == 1

        wa = await c.watch(a)
        wb = await c.watch("ops/sem", b.token)
        with pytest.raises(lockd.NotHeld):
            await c.watch("ops/sem", b.token + 1000)
        await c.release(a)
        assert await asyncio.wait_for(wa, 2) is lockd.Reason.RELEASED
        assert not wb.done()
        await c.release(b)
        assert await asyncio.wait_for(wb, 2) is lockd.Reason.RELEASED
        x = await asyncio.wait_for(t, 2)  # the writer had waited for both
        assert x.token > b.token and x.limit == 0
        assert (await c.inspect("ops/sem")).limit == 1
        await c.release(x)


@pytest.mark.timeout(60)
async def test_semaphore_never_exceeds_its_limit(shared_server: Cluster) -> None:
    """3 permits, 24 tasks over 3 clients, 5 rounds each: never more than 3
    holders at once (counted by the tasks, and by lockd's inspect), and the
    3 are used (it is no mutex)."""
    limit, per_client, rounds = 3, 8, 5
    holding = 0
    peak = 0
    seen_tokens: list[int] = []
    clients = [lockd.Client(shared_server.addrs) for _ in range(3)]
    try:

        async def worker(c: lockd.Client, rng: random.Random) -> None:
            nonlocal holding, peak
            sem = c.semaphore("sem/never", limit, wait=30, lease=10)
            for _ in range(rounds):
                async with sem as permit:
                    holding += 1
                    peak = max(peak, holding)
                    assert holding <= limit, f"{holding} holders of a semaphore of {limit}"
                    seen_tokens.append(permit.token)
                    await asyncio.sleep(rng.uniform(0.002, 0.015))
                    holding -= 1

        async def observe(c: lockd.Client, stop: asyncio.Event) -> int:
            most = 0
            while not stop.is_set():
                got = await c.inspect("sem/never")
                assert got.holders <= limit and got.limit in (0, limit), got
                most = max(most, got.holders)
                await asyncio.sleep(0.003)
            return most

        stop = asyncio.Event()
        obs = asyncio.ensure_future(observe(clients[0], stop))
        rng = random.Random(7)
        await asyncio.gather(
            *(worker(c, random.Random(rng.random())) for c in clients for _ in range(per_client))
        )
        stop.set()
        most = await obs
    finally:
        for c in clients:
            await c.close()
    assert len(seen_tokens) == len(set(seen_tokens)) == 3 * per_client * rounds
    assert peak == limit, f"at most {peak} holders at once: the permits were not all used"
    assert most <= limit


@pytest.mark.timeout(60)
async def test_rw_lock_no_reader_beside_a_writer(shared_server: Cluster) -> None:
    """Readers share the lock, a writer has it alone: 12 tasks over 2
    clients, 60 % readers, never a reader beside a writer, and readers do
    overlap; every writer's token is larger than every token before it."""
    readers = writers = 0
    most_readers = 0
    last_token = 0
    clients = [lockd.Client(shared_server.addrs) for _ in range(2)]
    try:

        async def worker(c: lockd.Client, rng: random.Random) -> None:
            nonlocal readers, writers, most_readers, last_token
            rw = c.rw_lock("rw/never", wait=30, lease=10)
            for _ in range(6):
                if rng.random() < 0.6:
                    async with rw.read():
                        assert writers == 0, "a reader beside a writer"
                        readers += 1
                        most_readers = max(most_readers, readers)
                        await asyncio.sleep(rng.uniform(0.005, 0.02))
                        readers -= 1
                else:
                    async with rw.write() as w:
                        assert readers == 0 and writers == 0, f"a writer beside {readers} readers, {writers} writers"
                        assert w.token > last_token, "a writer's token is the largest yet"
                        writers += 1
                        last_token = w.token
                        await asyncio.sleep(rng.uniform(0.002, 0.01))
                        writers -= 1

        rng = random.Random(11)
        await asyncio.gather(*(worker(c, random.Random(rng.random())) for c in clients for _ in range(6)))
    finally:
        for c in clients:
            await c.close()
    assert most_readers > 1, "readers never shared the lock"


async def test_waiting_writer_blocks_later_readers(shared_server: Cluster) -> None:
    """A reader holds; a writer queues; a later reader queues behind the
    writer (wait 0: T at once, though the key has room for readers), and is
    granted only after the writer, with a larger token."""
    async with lockd.Client(shared_server.addrs) as c:
        rw = c.rw_lock("rw/order", lease=10)
        order: list[str] = []
        r1 = await c.acquire_shared("rw/order", lockd.READERS)
        writer_in = asyncio.Event()
        writer_go = asyncio.Event()

        async def writer() -> int:
            async with rw.write(wait=10) as w:
                order.append("writer")
                writer_in.set()
                await writer_go.wait()
                return w.token

        async def reader() -> int:
            async with rw.read(wait=10) as r:
                order.append("reader")
                return r.token

        wt = asyncio.ensure_future(writer())
        while (await c.inspect("rw/order")).waiters < 1:
            await asyncio.sleep(0.005)
        with pytest.raises(lockd.Timeout):
            await c.acquire_shared("rw/order", lockd.READERS)  # no overtaking, even at wait 0
        rt = asyncio.ensure_future(reader())
        while (await c.inspect("rw/order")).waiters < 2:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        assert order == [] and not rt.done()
        await c.release(r1)
        await asyncio.wait_for(writer_in.wait(), 2)
        await asyncio.sleep(0.1)
        assert order == ["writer"], "a reader got in beside the writer"
        writer_go.set()
        wtok, rtok = await asyncio.wait_for(asyncio.gather(wt, rt), 2)
        assert order == ["writer", "reader"] and r1.token < wtok < rtok


@pytest.mark.timeout(40)
async def test_lost_at_once_on_a_forced_release(shared_server: Cluster) -> None:
    """The admin endpoint's DELETE of a held lock: lockd pushes L 3 and the
    holder's ``lost`` is set within milliseconds — not at its next renewal,
    10 s away — with LockLost.ended FORCED, for an exclusive lock and a
    semaphore's permit alike."""
    node = shared_server.nodes[0]
    async with lockd.Client(shared_server.addrs) as c:
        for ctx in (c.lock("lost/forced", wait=1, lease=30), c.semaphore("lost/forced-sem", 3, wait=1, lease=30)):
            lost_at: list[float] = []
            with pytest.raises(lockd.LockLost) as ei:
                async with ctx as held:
                    held.add_lost_callback(lambda _e: lost_at.append(time.monotonic()))
                    await _watched(c, held.key)
                    t0 = time.monotonic()
                    doc = await asyncio.to_thread(node.force_release, held.key, held.token)
                    assert doc["released"] is True
                    await asyncio.sleep(30)  # cancelled when the lock is lost
            assert ei.value.ended is lockd.Reason.FORCED, repr(ei.value)
            late = lost_at[0] - t0
            assert late < 0.1, f"lost {late * 1000:.0f} ms after the forced release began"


@pytest.mark.timeout(40)
async def test_lost_at_once_on_expiry(shared_server: Cluster) -> None:
    """Another connection renews the held grant with a 1 s lease (a renew
    acts on the exact token from anywhere): lockd ends the grant 1 s later,
    long before the holder's own next renewal (10 s) or stop time (30 s);
    its L 2 sets ``lost`` within milliseconds of the lease's end."""
    async with lockd.Client(shared_server.addrs) as c, lockd.Client(shared_server.addrs) as other:
        lost_at: list[float] = []
        with pytest.raises(lockd.LockLost) as ei:
            async with c.lock("lost/expired", wait=1, lease=30) as held:
                held.add_lost_callback(lambda _e: lost_at.append(time.monotonic()))
                await _watched(c, held.key)
                short = await other.renew(held.lock, lease=1)
                # The lease ends no earlier than 1 s after the renew was
                # sent and, on a server not overloaded, no more than 50 ms
                # later (§4); short.expires is that send + 1 s.
                await asyncio.sleep(30)
        assert ei.value.ended is lockd.Reason.EXPIRED, repr(ei.value)
        late = lost_at[0] - short.expires
        assert -0.01 <= late < 0.15, f"lost {late * 1000:.0f} ms after the lease's end"


async def _watched(c: lockd.Client, key: str) -> None:
    """Wait until the client's watch of its held lock on ``key`` is
    registered (the watch is sent in the background at the grant)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if any(s.conn is not None and s.conn.nreg > 0 for s in pool(c).slots):
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"the held lock on {key!r} was never watched")


def test_sync_client_s9(shared_server: Cluster) -> None:
    with lockd.SyncClient(shared_server.addrs) as c:
        with c.semaphore("sync/sem", 2, wait=1) as p1, c.semaphore("sync/sem", 2, wait=1) as p2:
            got = c.inspect("sync/sem")
            assert (got.holders, got.limit) == (2, 2)
            assert c.validate(p1.lock) > 0 and c.validate("sync/sem", p2.token) > 0
        rw = c.rw_lock("sync/rw", wait=1)
        with rw.read() as r:
            w = c.watch(r.lock)
        assert w.wait(2) is lockd.Reason.RELEASED
        with rw.write():
            assert c.inspect("sync/rw").limit == 1


@pytest.fixture(params=["priority", "raft"])
def cluster(request: pytest.FixtureRequest, lockd_bin: str, tmp_path: Path) -> Iterator[Cluster]:
    yield from cluster_fixture(request.param, lockd_bin, tmp_path, request)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_watch_moves_to_the_new_active_after_L4(
    cluster: Cluster, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM of the active/leader: it ends every watch with L 4 as its
    drain begins. A held lock — exclusive, or a semaphore's permit, a
    shared holder the cluster replicates — is not lost by it: it renews at
    the member that serves the key now and its watch is registered there,
    where a forced release then sets ``lost`` at once."""
    caplog.set_level(logging.INFO, logger="lockd")
    old = cluster.wait_leader()
    async with lockd.Client(cluster.addrs) as c:
        lost_at: list[float] = []
        ctx = c.lock("cluster/watched", wait=5, lease=30) if kind == "lock" else c.semaphore("cluster/sem", 3, wait=5, lease=30)
        with pytest.raises(lockd.LockLost) as ei:
            async with ctx as held:
                held.add_lost_callback(lambda _e: lost_at.append(time.monotonic()))
                await _watched(c, held.key)
                await asyncio.sleep(0.5)  # replicated
                assert await asyncio.to_thread(old.term) == 0
                new = await asyncio.to_thread(cluster.wait_leader, 20)
                assert new is not old
                deadline = time.monotonic() + 10
                while (await asyncio.to_thread(new.status)).get("watches", 0) < 1:
                    assert time.monotonic() < deadline, "the watch never moved to the new active"
                    assert not held.lost.is_set(), f"lost by the L 4: {held.error}"
                    await asyncio.sleep(0.05)
                assert not held.lost.is_set()
                t0 = time.monotonic()
                await asyncio.to_thread(new.force_release, held.key, held.token)
                await asyncio.sleep(30)
        assert ei.value.ended is lockd.Reason.FORCED, repr(ei.value)
        assert lost_at[0] - t0 < 0.2
    assert any("can no longer tell (L 4)" in r.getMessage() for r in caplog.records), "no L 4 came"


async def test_fence_validating(shared_server: Cluster) -> None:
    async with lockd.Client(shared_server.addrs) as c:
        held = await c.acquire("fence/v", lease=5)
        v = lockd.fence.Validating(c, min_remaining=1.0)
        left = await v.check("fence/v", held.token)
        assert 4.0 < left <= 5.0, left
        assert await v.do("fence/v", held.token, lambda: asyncio.sleep(0, "done")) == "done"
        with pytest.raises(lockd.fence.NotValid) as e:
            await v.check("fence/v", held.token + 1)
        assert isinstance(e.value.cause, lockd.NotHeld)
        # Not enough lease left: refused without acting.
        with pytest.raises(lockd.fence.NotValid) as e:
            await lockd.fence.Validating(c, min_remaining=30).check("fence/v", held.token)
        assert e.value.cause is None and 4.0 < e.value.left <= 5.0
        # The action is cut off when the lease could end.
        short = await c.acquire("fence/short", lease=1)
        with pytest.raises(TimeoutError):
            await lockd.fence.Validating(c).do("fence/short", short.token, lambda: asyncio.sleep(3))
        await c.release(held)
        with pytest.raises(lockd.fence.NotValid):
            await v.check("fence/v", held.token)


def test_fence_sync_validating(shared_server: Cluster) -> None:
    with lockd.SyncClient(shared_server.addrs) as c:
        held = c.acquire("fence/sv", lease=5)
        v = lockd.fence.SyncValidating(c)
        deadline = v.do("fence/sv", held.token, lambda d: d)
        assert 4.0 < deadline - time.monotonic() <= 5.0
        c.release(held)
        with pytest.raises(lockd.fence.NotValid):
            v.check("fence/sv", held.token)
