"""The shared client conformance cases (clients/conformance/*.json, schema in
its README): the Go client's suite reads the same files, so the two clients
answer the same caller the same way. Each case runs against a real lockd of
the kind it names."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

import lockd
from harness import Certs, Cluster, loop_lag, make_certs, repo_path, wait_for

CASES_FILE = repo_path("clients/conformance/deadline.json")

# The runner may widen max_ms (never min_ms) on a loaded machine: the cases
# are written for an idle one. It adds SLACK_MS, and how late the event loop
# ran callbacks due when the outcome may be decided (min_ms, the wait, the
# cancellation, the holder's release): the client cannot answer before its
# loop runs it.
SLACK_MS = float(os.environ.get("LOCKD_CONFORMANCE_SLACK_MS", "100"))

OUTCOMES = {"acquired", "timeout", "busy", "no_connection", "indeterminate", "cancelled"}


def _cases() -> list[dict[str, Any]]:
    doc = json.loads(CASES_FILE.read_text())
    cases: list[dict[str, Any]] = doc["cases"]
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


class Servers:
    """One lockd per server kind, started on first use, killed at the end."""

    def __init__(self, binary: str, root: Path, certs: Certs) -> None:
        self.binary = binary
        self.root = root
        self.certs = certs
        self.started: dict[str, Cluster] = {}
        self.hogs: list[socket.socket] = []

    def get(self, kind: str) -> Cluster:
        if kind in self.started:
            return self.started[kind]
        c = self.certs
        tls = ["--tls-cert", str(c.server_cert), "--tls-key", str(c.server_key)]
        extra = {
            "plain": [],
            "tls": tls,
            "mtls": [*tls, "--tls-client-ca", str(c.ca)],
            "max_conns_0": ["--max-conns", "1"],
        }.get(kind)
        if extra is None:
            raise AssertionError(f"unknown server kind {kind!r}: teach the runner")
        srv = Cluster(self.binary, self.root / kind, extra=extra).start()
        self.started[kind] = srv
        if kind == "max_conns_0":
            self.hogs.append(_take_the_one_connection(srv.addrs[0]))
        return srv

    def close(self) -> None:
        for s in self.hogs:
            s.close()
        for srv in self.started.values():
            srv.close()


def _take_the_one_connection(addr: str) -> socket.socket:
    """Open the server's one allowed connection and prove it is served (a
    ping answered), so that every later connection is over the limit."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    nonce = 0x5EED
    s.sendall(lockd.proto.encode_ping(nonce))
    want = lockd.proto.encode_pong(nonce)
    got = b""
    while len(got) < len(want):
        chunk = s.recv(64)
        if not chunk:
            raise AssertionError("lockd --max-conns 1 closed the runner's own connection")
        got += chunk
    assert got == want, got
    return s


@pytest.fixture(scope="module")
def servers(lockd_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("conformance")
    s = Servers(lockd_bin, root, make_certs(root / "certs"))
    yield s
    s.close()


def _client(case: dict[str, Any], srv: Cluster, certs: Certs) -> lockd.Client:
    """The client under test, configured as the case says."""
    kind = case["server"]
    cc = case.get("client", {})
    kw: dict[str, Any] = {}
    if cc.get("tls", kind in ("tls", "mtls")):
        want_cert = cc.get("cert", kind == "mtls")
        kw["ssl"] = lockd.tls_context(
            ca=str(certs.ca),
            cert=str(certs.client_cert) if want_cert else None,
            key=str(certs.client_key) if want_cert else None,
        )
    if "conns" in cc:
        kw["conns_per_addr"] = cc["conns"]
    return lockd.Client(srv.addrs, **kw)


def _outcome(res: BaseException | lockd.Lock) -> str:
    if isinstance(res, lockd.Lock):
        return "acquired"
    if isinstance(res, asyncio.CancelledError):
        return "cancelled"
    for name, cls in (
        ("timeout", lockd.Timeout),
        ("busy", lockd.Busy),
        ("no_connection", lockd.NoConnection),
        ("indeterminate", lockd.Indeterminate),
    ):
        if isinstance(res, cls):
            return name
    return f"unexpected {type(res).__name__}: {res}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", _cases(), ids=lambda c: str(c["name"]))
async def test_case(case: dict[str, Any], servers: Servers) -> None:
    srv = await asyncio.to_thread(servers.get, case["server"])
    if case["call"]["op"] != "acquire":
        raise AssertionError(f"unknown call op {case['call']['op']!r}: teach the runner")
    assert case["expect"]["outcome"] in OUTCOMES, case["expect"]
    bg: list[asyncio.Task[None]] = []
    try:
        async with _client(case, srv, servers.certs) as c, lockd.Client(srv.addrs) as holder:
            await _run(case, srv, c, holder, bg)
    finally:
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)


async def _run(case: dict[str, Any], srv: Cluster, c: lockd.Client, holder: lockd.Client, bg: list[asyncio.Task[None]]) -> None:
    call, expect, after = case["call"], case["expect"], case.get("after", {})
    key = call.get("key") or f"conformance/{uuid.uuid4().hex}"
    loop = asyncio.get_running_loop()
    holder_cfg = case.get("holder")
    held = None
    if holder_cfg is not None:
        held = await holder.acquire(key, lease=holder_cfg["lease_s"])
    if case["server"] == "plain":
        want = case.get("client", {}).get("conns", 2)  # a single node: two connections by default
        await wait_for(f"{want} live connections", lambda: c.live_connections() == want, 5)
    conns_before = c.live_connections()

    task = asyncio.ensure_future(c.acquire(key, wait=call["wait_ms"] / 1000, lease=call["lease_s"]))
    start = loop.time()
    # When the outcome may be decided: the loop's lateness at those moments.
    moments = {expect["min_ms"], call["wait_ms"]}
    for m in (call.get("cancel_after_ms"), (holder_cfg or {}).get("release_after_ms")):
        if m is not None:
            moments.add(m)
    lags = [(m, loop_lag(start + m / 1000)) for m in sorted(moments)]
    if held is not None and holder_cfg is not None and holder_cfg.get("release_after_ms") is not None:

        async def release_later(lk: lockd.Lock, after_ms: float) -> None:
            await asyncio.sleep(start + after_ms / 1000 - loop.time())
            await holder.release(lk)

        bg.append(asyncio.ensure_future(release_later(held, holder_cfg["release_after_ms"])))
    if call.get("cancel_after_ms") is not None:
        loop.call_at(start + call["cancel_after_ms"] / 1000, task.cancel)
    res: BaseException | lockd.Lock
    try:
        res = await task
    except BaseException as e:  # the outcome is the test
        res = e
    took = (loop.time() - start) * 1000
    late = max((lag() * 1000 for m, lag in lags if m <= took), default=0.0)
    got = _outcome(res)
    assert got == expect["outcome"], f"{case['name']}: got {got} ({res!r}) after {took:.0f} ms"
    assert expect["min_ms"] <= took <= expect["max_ms"] + SLACK_MS + late, (
        f"{case['name']}: returned after {took:.0f} ms, want {expect['min_ms']}..{expect['max_ms']} ms"
        f" (+{SLACK_MS:.0f} ms slack, +{late:.0f} ms the loop ran late)"
    )
    cause = expect.get("cause")
    if cause is not None:
        assert isinstance(res, lockd.NoConnection)
        if cause == "rejected":
            assert isinstance(res.cause, lockd.Rejected), f"cause {res.cause!r}"
        elif cause == "tls":
            assert "tls" in str(res).lower(), f"the error does not name TLS: {res}"
        else:
            raise AssertionError(f"unknown cause {cause!r}: teach the runner")
    if after.get("conns_kept"):
        assert c.live_connections() == conns_before, "the call cost a connection"
    if isinstance(res, lockd.Lock):
        await c.release(res)
    # The holder releases (if it has not yet).
    if bg:
        await bg[0]
    elif held is not None:
        await holder.release(held)
    within = after.get("key_free_within_ms")
    if within is not None:
        t0 = loop.time()
        async with lockd.Client(srv.addrs) as third:
            lk = await third.acquire(key, wait=max(within / 1000, 1), lease=5)
            free_after = (loop.time() - t0) * 1000
            await third.release(lk)
        assert free_after <= within, f"the key was held by nobody for {free_after:.0f} ms"
    if after.get("conns_kept"):
        assert c.live_connections() == conns_before, "the call cost a connection"
