"""A caller's cancellation of a waiting acquire (``task.cancel()``,
``asyncio.wait_for``, ``asyncio.timeout``) against the real server: the
connection stays, the other waiters on it are served, and a grant that
arrives for the cancelled call is released at once (PROTOCOL.md §7's
compensating release), however the grant and the cancellation race."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Awaitable, Callable

import pytest

import lockd
from harness import Cluster, wait_for


async def waiters(srv: Cluster, key: str, n: int) -> None:
    """Wait until the server has n acquires of key queued."""
    deadline = time.monotonic() + 5
    while (await asyncio.to_thread(srv.nodes[0].key_state, key)).get("waiters") != n:
        assert time.monotonic() < deadline, f"{key}: {n} waiters never queued"
        await asyncio.sleep(0.01)


async def _via_cancel(call: Awaitable[lockd.Lock], at: float) -> lockd.Lock:
    t = asyncio.ensure_future(call)
    asyncio.get_running_loop().call_at(at, t.cancel)
    return await t


async def _via_wait_for(call: Awaitable[lockd.Lock], at: float) -> lockd.Lock:
    return await asyncio.wait_for(call, at - asyncio.get_running_loop().time())


async def _via_timeout(call: Awaitable[lockd.Lock], at: float) -> lockd.Lock:
    async with asyncio.timeout_at(at):
        return await call


WAYS: dict[str, Callable[[Awaitable[lockd.Lock], float], Awaitable[lockd.Lock]]] = {
    "task.cancel": _via_cancel,
    "wait_for": _via_wait_for,
    "timeout": _via_timeout,
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("way", sorted(WAYS))
async def test_grant_racing_cancellation_is_released(shared_server: Cluster, way: str) -> None:
    """Hundreds of rounds in which the holder's release hands the key to a
    waiter just as the waiter is cancelled (the release sent from 4 ms before
    to 1 ms after the cancellation: the grant is taken, or on the wire, or
    made after the cancellation): whichever wins, no round may
    leave the key held by nobody. A leaked grant (lease 30 s) shows as a key
    that a third client cannot take within 2 s."""
    cancel = WAYS[way]
    key = f"cancel-race/{way}"
    rounds, budget = 300, 40.0
    rng = random.Random(0x10CD)
    loop = asyncio.get_running_loop()
    outcomes = {"granted": 0, "cancelled": 0}
    async with lockd.Client(shared_server.addrs) as holder, lockd.Client(
        shared_server.addrs
    ) as waiter, lockd.Client(shared_server.addrs) as third:
        await wait_for("the waiter's connections", lambda: waiter.live_connections() == 2)
        start = time.monotonic()
        n = dropped = 0
        while n < rounds and time.monotonic() - start < budget:
            n += 1
            lk = await holder.acquire(key, lease=30)
            at = loop.time() + 0.01
            w = asyncio.ensure_future(cancel(waiter.acquire(key, wait=5, lease=30), at))
            jitter = rng.uniform(-0.004, 0.001)
            await asyncio.sleep(at + jitter - loop.time())
            await holder.release(lk)
            try:
                got = await w
            except (asyncio.CancelledError, TimeoutError):
                outcomes["cancelled"] += 1
            else:
                outcomes["granted"] += 1
                await waiter.release(got)
            try:
                free = await third.acquire(key, wait=2, lease=30)
            except lockd.Timeout:
                pytest.fail(f"round {n} ({way}): the key was left held by nobody; outcomes so far {outcomes}")
            await third.release(free)
            if waiter.live_connections() != 2:
                dropped += 1
        assert n >= 100, f"only {n} rounds in {budget} s"
        assert dropped == 0, f"{dropped} of {n} cancellations cost a connection"
        assert outcomes["cancelled"] > 0 and outcomes["granted"] > 0, f"the race was not run both ways: {outcomes}"
        print(f"{way}: {n} rounds, {outcomes}")


@pytest.mark.timeout(30)
async def test_cancelled_waiter_keeps_the_connection_and_its_neighbours(shared_server: Cluster) -> None:
    """Two waiters pipelined on one connection: cancelling one keeps the
    connection and fails nothing else on it; the other is granted when its
    key is freed, and the grant that later arrives for the cancelled one is
    released at once."""
    async with lockd.Client(shared_server.addrs) as holder, lockd.Client(
        shared_server.addrs, conns_per_addr=1
    ) as c, lockd.Client(shared_server.addrs) as third:
        await wait_for("one connection", lambda: c.live_connections() == 1)
        a = await holder.acquire("neighbours/a", lease=30)
        b = await holder.acquire("neighbours/b", lease=30)
        wa = asyncio.ensure_future(c.acquire("neighbours/a", wait=10, lease=30))
        wb = asyncio.ensure_future(c.acquire("neighbours/b", wait=10, lease=30))
        for k in ("neighbours/a", "neighbours/b"):
            await waiters(shared_server, k, 1)
        wa.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wa
        await holder.release(b)
        got = await asyncio.wait_for(wb, 2)  # not Indeterminate: its connection lives
        assert c.live_connections() == 1
        await holder.release(a)  # handed to the cancelled waiter's request...
        t0 = time.monotonic()
        lk = await third.acquire("neighbours/a", wait=2, lease=5)  # ...which releases it at once
        assert time.monotonic() - t0 < 1
        await third.release(lk)
        await c.release(got)


@pytest.mark.timeout(30)
async def test_timeouts_keep_connections(shared_server: Cluster) -> None:
    """Two wait_for timeouts on waiting acquires cost no connection: the next
    acquire does not wait for a redial."""
    async with lockd.Client(shared_server.addrs) as holder, lockd.Client(shared_server.addrs) as c:
        await wait_for("two connections", lambda: c.live_connections() == 2)
        lk = await holder.acquire("timeouts/held", lease=30)
        for _ in range(2):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(c.acquire("timeouts/held", wait=10), 0.2)
        assert c.live_connections() == 2
        t0 = time.monotonic()
        other = await c.acquire("timeouts/free", wait=5)
        assert time.monotonic() - t0 < 0.5, "the next acquire waited for a redial"
        await c.release(other)
        await holder.release(lk)
