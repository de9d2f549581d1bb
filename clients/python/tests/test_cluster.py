"""M followed against real clusters (``--cluster priority`` and ``--cluster
raft``, three lockd processes each), with kill -9 of the active/leader while
a ``with c.lock()`` block runs: the lock stays held across the failover, its
renewals follow the new active, and the release at the end executes there."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

import lockd
from conftest import cluster_fixture
from harness import Cluster, Node, pool


@pytest.fixture
def priority(lockd_bin: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    yield from cluster_fixture("priority", lockd_bin, tmp_path, request)


@pytest.fixture
def raft(lockd_bin: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    yield from cluster_fixture("raft", lockd_bin, tmp_path, request)


LEASE = 6  # renewed every 2 s; the failover (within 3 s) must not lose it
HOLD_AFTER_KILL = 2 * LEASE + 1


@pytest.mark.timeout(90)
async def test_moved_followed_to_the_active(priority: Cluster) -> None:
    """A client given only a standby is redirected by M to the active, sends
    there from then on, and its lock is held there."""
    active = priority.wait_leader()
    standby = next(nd for nd in priority.nodes if nd is not active)
    async with lockd.Client([standby.addr]) as c:
        lk = await c.acquire("cluster/moved", wait=5, lease=30)
        assert pool(c).preferred == active.addr
        assert active.key_state("cluster/moved")["held"] is True
        await c.release(lk)
        assert active.key_state("cluster/moved")["held"] is False


@pytest.mark.timeout(90)
def test_priority_kill_active_while_lock_held(priority: Cluster) -> None:
    active = priority.wait_leader()
    with lockd.SyncClient(priority.addrs) as c, lockd.SyncClient(priority.addrs) as other:
        with c.lock("cluster/p", wait=5, lease=LEASE) as lock:
            time.sleep(1)  # replicated: the lag is milliseconds
            active.kill()
            killed = time.monotonic()
            new = priority.wait_leader(timeout=15)
            assert new is not active
            while time.monotonic() - killed < HOLD_AFTER_KILL:
                time.sleep(0.5)
                lock.check()  # raises LockLost if a renewal failed
            with pytest.raises(lockd.Timeout):
                other.acquire("cluster/p")  # held on the new active
            assert new.key_state("cluster/p")["token"] == str(lock.token)
        # The exit released it there (a release answered N would have raised).
        assert new.key_state("cluster/p")["held"] is False
        lk = other.acquire("cluster/p", wait=5)
        assert lk.token > lock.token
        other.release(lk)


@pytest.mark.timeout(90)
async def test_raft_kill_leader_while_lock_held(raft: Cluster) -> None:
    leader = raft.wait_leader()
    async with lockd.Client(raft.addrs) as c, lockd.Client(raft.addrs) as other:
        async with c.lock("cluster/r", wait=5, lease=LEASE) as lock:
            await asyncio.sleep(0.5)
            leader.kill()
            killed = time.monotonic()
            new = await asyncio.to_thread(raft.wait_leader, 15)
            assert new is not leader
            while time.monotonic() - killed < HOLD_AFTER_KILL:
                await asyncio.sleep(0.5)  # the block would be cancelled here if the lock were lost
            assert not lock.lost.is_set()
            with pytest.raises(lockd.Timeout):
                await other.acquire("cluster/r")
        lk = await other.acquire("cluster/r", wait=5)
        assert lk.token > lock.token
        await other.release(lk)


def _serving(cluster: Cluster, frozen: Node, timeout: float) -> Node:
    """The member other than ``frozen`` that reports itself active/leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for nd in cluster.nodes:
            if nd is frozen:
                continue
            try:
                if nd.status().get("role") in ("active", "leader"):
                    return nd
            except OSError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"no member took over from the frozen one in {timeout} s\n{cluster.dump()}")


# The lease of the frozen test per mode: renewed every third of it, each
# attempt waiting at most a quarter, so a renewal stuck on the frozen
# member is retried elsewhere with 5/12 of the lease left. That half must cover the
# failover: priority promotes after one failover timeout (1 s) of silence;
# raft's election timeout is drawn from one to two failover timeouts, then
# a vote round and the new leader's catch-up, so it gets a longer lease.
FROZEN_LEASE = {"priority": 3, "raft": 6}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["priority", "raft"])
async def test_frozen_active_costs_no_short_lease_lock(
    mode: str, lockd_bin: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGSTOP of the active/leader while a lock with a short lease is held:
    the renewals stop waiting on the frozen member early enough (the
    transport timeout scales with the lease), find the new active, and the
    lock stays held there with its token for several leases."""
    lease = FROZEN_LEASE[mode]
    gen = cluster_fixture(mode, lockd_bin, tmp_path, request)
    cluster = next(gen)
    active = await asyncio.to_thread(cluster.wait_leader)
    assert active.proc is not None
    try:
        async with lockd.Client(cluster.addrs) as c:
            async with c.lock("frozen/short", wait=5, lease=lease) as lock:
                # Freeze right after a renewal: the whole lease is then the
                # budget for the failover and the client's move, which the
                # old client (stuck on the frozen member for its 5 s
                # transport timeout) overran in every mode.
                renewed = lock.expires
                while lock.expires == renewed:
                    await asyncio.sleep(0.005)
                os.kill(active.proc.pid, signal.SIGSTOP)
                new = await asyncio.to_thread(_serving, cluster, active, 15)
                end = time.monotonic() + 3 * lease
                while time.monotonic() < end:
                    await asyncio.sleep(0.25)  # the block is cancelled here if the lock is lost
                st = await asyncio.to_thread(new.key_state, "frozen/short")
                assert st["held"] is True and st["token"] == str(lock.token), st
    except BaseException:
        print(cluster.dump())
        raise
    finally:
        os.kill(active.proc.pid, signal.SIGCONT)
        for _ in gen:
            pass
