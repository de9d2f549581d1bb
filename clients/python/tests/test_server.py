"""Against the real lockd binary: the operations, and the §7 faults through an
in-test TCP proxy that parses the frames it forwards."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import lockd
from harness import Cluster, Proxy, wait_for
from lockd import proto


async def test_operations(shared_server: Cluster) -> None:
    addr = shared_server.addrs[0]
    async with lockd.Client([addr]) as c:
        assert await c.ping() < 1
        lk = await c.acquire("ops/a", wait=1, lease=5)
        assert lk.key == "ops/a" and lk.token > 0
        with pytest.raises(lockd.Timeout):
            await c.acquire("ops/a")  # wait 0 on a held key: T at once
        start = time.monotonic()
        with pytest.raises(lockd.Timeout):
            await c.acquire("ops/a", wait=1)
        assert 1.0 <= time.monotonic() - start < 2.0
        lk2 = await c.renew(lk, 10)
        assert lk2.token == lk.token and lk2.expires > lk.expires
        await c.release(lk)
        with pytest.raises(lockd.NotHeld):
            await c.release(lk)
        with pytest.raises(lockd.NotHeld):
            await c.renew(lk)
        nxt = await c.acquire("ops/a")
        assert nxt.token > lk.token, "tokens only grow"
        await c.release(nxt)


async def test_handoff_in_fifo_order(shared_server: Cluster) -> None:
    """A release hands the key to the queue head: waiters get it in the
    order they queued, each with a larger token."""
    async with lockd.Client(shared_server.addrs) as c:
        first = await c.acquire("ops/fifo", wait=1)
        order: list[int] = []

        async def waiter(i: int) -> int:
            lk = await c.acquire("ops/fifo", wait=10)
            order.append(i)
            await c.release(lk)
            return lk.token

        tasks = []
        for i in range(5):
            tasks.append(asyncio.ensure_future(waiter(i)))
            await asyncio.sleep(0.05)  # queue in this order
        await c.release(first)
        tokens = await asyncio.gather(*tasks)
        assert order == list(range(5))
        assert tokens == sorted(tokens) and tokens[0] > first.token


async def test_busy_and_server_errors(lockd_bin: str, tmp_path: Path) -> None:
    """B when the queue is full; E 2 for a key over --max-key."""
    srv = Cluster(lockd_bin, tmp_path, extra=["--max-waiters-per-key", "1", "--max-key", "8"]).start()
    try:
        async with lockd.Client(srv.addrs) as c:
            lk = await c.acquire("busy", wait=1)
            queued = asyncio.ensure_future(c.acquire("busy", wait=5))
            await asyncio.sleep(0.2)
            with pytest.raises(lockd.Busy):
                await c.acquire("busy", wait=5)
            await c.release(lk)
            await c.release(await queued)
            with pytest.raises(lockd.ServerError) as ei:
                await c.acquire("123456789", wait=1)
            assert ei.value.code == proto.CODE_BAD_KEY
            await c.ping()  # the connection stays open
    finally:
        srv.close()


@pytest.mark.timeout(40)
async def test_throughput_smoke(shared_server: Cluster) -> None:
    """64 tasks on one client: every pair completes, tokens unique."""
    async with lockd.Client(shared_server.addrs) as c:
        tokens: list[int] = []

        async def worker(i: int) -> None:
            for _ in range(100):
                lk = await c.acquire(f"tp/{i % 8}", wait=10)
                tokens.append(lk.token)
                await c.release(lk)

        await asyncio.gather(*(worker(i) for i in range(64)))
        assert len(set(tokens)) == 6400


async def test_drop_after_send_indeterminate_nothing_resent(shared_server: Cluster) -> None:
    """The acquire reaches the server, then the connection drops before the
    answer: Indeterminate, and the request is not sent again on any
    connection."""

    def rule(conn: int, r: proto.Request) -> str:
        return "forward_then_drop" if r.op == proto.OP_ACQUIRE else "forward"

    px = await Proxy(shared_server.addrs[0], on_request=rule).start()
    async with lockd.Client([px.addr], reconnect_interval=0.1) as c:
        await wait_for("two connections", lambda: c.live_connections() == 2)
        for wait in (2, 0):
            n = len(px.requests(proto.OP_ACQUIRE))
            with pytest.raises(lockd.Indeterminate):
                await c.acquire(f"fault/drop-{wait}", wait=wait, lease=30)
            await asyncio.sleep(0.5)
            sent = px.requests(proto.OP_ACQUIRE)[n:]
            assert len(sent) == 1, f"the acquire went out {len(sent)} times"
    await px.close()
    # The server did execute it (it is held, by nobody who knows): that is
    # what Indeterminate warns of.
    assert shared_server.nodes[0].key_state("fault/drop-2")["held"] is True


async def test_late_grant_compensating_release_seen_by_server(shared_server: Cluster) -> None:
    """An A that arrives after the caller's deadline: the client releases
    that exact token, and the server frees the key."""
    key = "fault/late-grant"

    def delay(conn: int, resp: proto.Response) -> float:
        return 0.6 if resp.op == proto.OP_ACQUIRE and resp.tail == key.encode() else 0.0

    px = await Proxy(shared_server.addrs[0], delay_response=delay).start()
    node = shared_server.nodes[0]
    async with lockd.Client([px.addr]) as c:
        # wait 0.2 s: the wire wait is 1 s; the grant, held back 0.6 s by
        # the proxy, comes after the call's 0.2 s deadline, at which the
        # call raised Timeout.
        with pytest.raises(lockd.Timeout):
            await c.acquire(key, wait=0.2, lease=60)
        grants = px.responses(proto.OP_ACQUIRE)
        assert len(grants) == 1
        token = grants[0].token
        await wait_for("the compensating release", lambda: any(s.id == token for s in px.requests(proto.OP_RELEASE)), 3)
        await wait_for("the server freed the key", lambda: node.key_state(key)["held"] is False, 3)
    await px.close()


async def test_release_retried_across_a_drop(shared_server: Cluster) -> None:
    """The first release is lost with its connection (never forwarded): the
    client sends it again 200 ms later on another connection, and the server
    releases."""
    dropped: list[float] = []

    def rule(conn: int, r: proto.Request) -> str:
        if r.op == proto.OP_RELEASE and not dropped:
            dropped.append(time.monotonic())
            return "drop"
        return "forward"

    px = await Proxy(shared_server.addrs[0], on_request=rule).start()
    node = shared_server.nodes[0]
    async with lockd.Client([px.addr]) as c:
        await wait_for("two connections", lambda: c.live_connections() == 2)
        lk = await c.acquire("fault/release", wait=1, lease=60)
        await c.release(lk)
        rels = px.requests(proto.OP_RELEASE)
        assert len(rels) == 2 and rels[0].id == rels[1].id == lk.token
        assert rels[1].at - rels[0].at >= 0.2, "retried before the 200 ms interval"
        assert rels[0].conn != rels[1].conn, "retried on the dropped connection"
        assert node.key_state("fault/release")["held"] is False
    await px.close()


@pytest.mark.timeout(40)
async def test_dead_server_redialled(lockd_bin: str, tmp_path: Path) -> None:
    """The server dies (kill -9) and comes back on its address: calls made
    meanwhile fail with NoConnection (not Timeout), and the client is back
    at the next 3 s redial."""
    srv = Cluster(lockd_bin, tmp_path).start()
    node = srv.nodes[0]
    try:
        async with lockd.Client(srv.addrs) as c:
            await c.ping()
            node.kill()
            await wait_for("connections down", lambda: c.live_connections() == 0)
            down = time.monotonic()
            with pytest.raises(lockd.NoConnection):
                await c.acquire("redial", wait=0.5)
            node.start()
            await c.acquire("redial", wait=8)
            el = time.monotonic() - down
            assert 2.9 <= el <= 4.5, f"back after {el:.2f} s, want the 3 s redial"
    finally:
        srv.close()


async def test_wait_zero_one_attempt(shared_server: Cluster) -> None:
    """wait=0 never queues: a held key is T at once, through the server."""
    px = await Proxy(shared_server.addrs[0]).start()
    async with lockd.Client([px.addr]) as c:
        lk = await c.acquire("w0/held")
        start = time.monotonic()
        with pytest.raises(lockd.Timeout):
            await c.acquire("w0/held")
        assert time.monotonic() - start < 0.5
        a = px.requests(proto.OP_ACQUIRE)
        assert [s.key for s in a] == ["w0/held", "w0/held"]
        await c.release(lk)
    await px.close()
