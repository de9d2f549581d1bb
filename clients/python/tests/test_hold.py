"""Holding a lock as a user meets it: what ``LockLost`` says, the lease a
lock is renewed with, how soon a dead server's lost lock is reported, what
is logged, and the typed surface (``Timeout`` is a ``TimeoutError``,
``SyncClient`` takes ``Client``'s keyword options)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from pathlib import Path

import pytest

import lockd
from harness import Cluster, Fake, FConn, FReq
from lockd import proto


def no_renewals(fc: FConn, r: FReq) -> None:
    """Answer everything but renewals."""
    if r.op != proto.OP_RENEW:
        fc.auto(r)


async def test_lock_lost_reason_at_stop_time_is_none() -> None:
    """LockLost.reason is None when the stop time passed without a renewal
    (its docstring); the last renewal error is its __cause__."""
    f = await Fake(no_renewals).start()
    async with lockd.Client([f.addr], transport_timeout=0.5, retry_pause=0.05) as c:
        held = await c.keep_alive(await c.acquire("reason", wait=1, lease=2), lease=2)
        await asyncio.wait_for(held.lost.wait(), 4)
        assert held.error is not None
        assert held.error.reason is None, repr(held.error.reason)
        assert held.error.__cause__ is not None, "the last renewal error is kept as the cause"
    await f.close()


async def test_keep_alive_uses_the_locks_own_lease() -> None:
    """A lock taken with a 3 s lease is renewed for 3 s, not the client's
    default 30 s; renew(lock) without a lease too."""
    f = await Fake().start()
    async with lockd.Client([f.addr], default_lease=30) as c:
        lk = await c.acquire("own-lease", wait=1, lease=3)
        assert lk.lease == 3
        assert (await f.next()).lease == 3
        held = await c.keep_alive(lk)
        r = await f.next(timeout=3)
        assert (r.op, r.lease) == (proto.OP_RENEW, 3), "renewed with another lease than the lock's"
        await held.stop()
        lk2 = await c.renew(lk)
        assert (await f.next()).lease == 3 and lk2.lease == 3
    await f.close()


@pytest.mark.timeout(40)
async def test_lock_lost_reported_at_once_when_the_server_dies(lockd_bin: str, tmp_path: Path) -> None:
    """The server is killed while a block holds the lock: LockLost leaves the
    block when the lock is lost, without waiting out release retries."""
    srv = Cluster(lockd_bin, tmp_path).start()
    try:
        async with lockd.Client(srv.addrs) as c:
            lost_at: list[float] = []
            with pytest.raises(lockd.LockLost):
                async with c.lock("dies", wait=1, lease=2) as held:
                    held.add_lost_callback(lambda _e: lost_at.append(time.monotonic()))
                    srv.close()
                    await asyncio.sleep(30)  # cancelled when the lock is lost
            late = time.monotonic() - lost_at[0]
            assert late < 1, f"LockLost raised {late:.2f} s after the loss (release retries take 5 s)"
    finally:
        srv.close()


@pytest.mark.timeout(40)
def test_sync_lock_lost_reported_at_once_when_the_server_dies(lockd_bin: str, tmp_path: Path) -> None:
    srv = Cluster(lockd_bin, tmp_path).start()
    try:
        with lockd.SyncClient(srv.addrs) as c:
            lost_at = 0.0
            with pytest.raises(lockd.LockLost):
                with c.lock("dies", wait=1, lease=2) as held:
                    srv.close()
                    assert held.lost.wait(10)
                    lost_at = time.monotonic()
            late = time.monotonic() - lost_at
            assert late < 1, f"LockLost raised {late:.2f} s after the loss (release retries take 5 s)"
    finally:
        srv.close()


async def test_logging(caplog: pytest.LogCaptureFixture) -> None:
    """The "lockd" logger: a failed renewal is a WARNING, the lost lock too;
    an M followed to another member is INFO."""
    caplog.set_level(logging.INFO, logger="lockd")
    f = await Fake(no_renewals).start()
    async with lockd.Client([f.addr], transport_timeout=0.4, retry_pause=0.05) as c:
        held = await c.keep_alive(await c.acquire("logged", wait=1, lease=1), lease=1)
        await asyncio.wait_for(held.lost.wait(), 4)
    await f.close()
    recs = [r for r in caplog.records if r.name.startswith("lockd")]
    assert any(r.levelno == logging.WARNING and "renew" in r.getMessage() for r in recs), recs
    assert any(r.levelno >= logging.WARNING and "lost" in r.getMessage() for r in recs), recs
    caplog.clear()
    active = await Fake().start()
    standby = await Fake(lambda fc, r: fc.send(proto.encode_moved(r.op, r.id, active.addr.encode()))).start()
    async with lockd.Client([standby.addr]) as c:
        await c.acquire("moved", wait=1)
    await active.close()
    await standby.close()
    assert any(r.levelno == logging.INFO and active.addr in r.getMessage() for r in caplog.records), caplog.records


def test_timeout_is_a_timeout_error() -> None:
    assert issubclass(lockd.Timeout, TimeoutError)
    assert issubclass(lockd.Timeout, lockd.LockdError)


def test_sync_client_takes_the_clients_keyword_options() -> None:
    """SyncClient's signature is Client's, keyword by keyword, so that a typo
    is a TypeError (and a mypy error), not a surprise inside the loop."""
    sp = inspect.signature(lockd.SyncClient.__init__).parameters
    cp = inspect.signature(lockd.Client.__init__).parameters
    assert [(n, p.kind, p.default) for n, p in sp.items()] == [(n, p.kind, p.default) for n, p in cp.items()]
    assert all(p.kind != inspect.Parameter.VAR_KEYWORD for p in sp.values())
    with pytest.raises(TypeError):
        lockd.SyncClient(["127.0.0.1:1"], dial_timout=1)  # type: ignore[call-arg]
