"""PROTOCOL.md §8.6: the hello on every connection, TLS through
ssl.SSLContext, E 5 and E 6 — against the real server (hello without --acl),
a TLS-terminating proxy in front of it, the scripted fake, and, once the
binary has them, the real --acl and --tls-* flags."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import time
from pathlib import Path
from typing import Iterator

import pytest

import lockd
from harness import Certs, Cluster, Fake, FConn, FReq, Proxy, make_certs, wait_for
from lockd import proto


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def server_ctx(certs: Certs, client_ca: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(certs.ca)
    return ctx


# The hello against the real server (no --acl: H is answered naming the
# identity, §8.3's last paragraph).


async def test_hello_first_on_every_connection(shared_server: Cluster) -> None:
    """H is the first frame on every connection the client opens (again after
    a redial), requests are pipelined behind it without waiting for the
    welcome, and the server's welcome names the identity."""
    delay = 0.5

    def hold_welcome(conn: int, resp: proto.Response) -> float:
        return delay if resp.op == proto.OP_HELLO else 0.0

    px = await Proxy(shared_server.addrs[0], delay_response=hold_welcome).start()
    async with lockd.Client([px.addr], identity="orders", secret="orders secret with spaces", reconnect_interval=0.1) as c:
        start = time.monotonic()
        lk = await c.acquire("hello/a", wait=1)
        assert time.monotonic() - start >= delay * 0.9, "the answer came before the welcome ahead of it"
        await c.release(lk)
        assert c.identity == "orders"
        await wait_for("two connections", lambda: c.live_connections() == 2)
        for conn in range(px.accepted):
            frames = [s for s in px.seen if s.conn == conn and s.dir == "c2s"]
            assert frames and frames[0].op == proto.OP_HELLO, f"connection {conn}: first frame {frames[:1]}"
            assert frames[0].key == "orders orders secret with spaces"
            assert sum(1 for s in frames if s.op == proto.OP_HELLO) == 1
        acq = px.requests(proto.OP_ACQUIRE)[0]
        welcome = [s for s in px.seen if s.dir == "s2c" and s.op == proto.OP_HELLO and s.conn == acq.conn][0]
        assert acq.at < welcome.at + delay, "the acquire waited for the welcome instead of being pipelined"
        n = px.accepted
        for w in list(px._writers):  # cut every connection: the redials say hello again
            w.transport.abort()
        await wait_for("redialled", lambda: px.accepted >= n + 2 and c.live_connections() == 2, 5)
        await c.ping()
        for conn in range(n, px.accepted):
            frames = [s for s in px.seen if s.conn == conn and s.dir == "c2s"]
            assert frames and frames[0].op == proto.OP_HELLO
    await px.close()


async def test_no_hello_without_secret(shared_server: Cluster) -> None:
    """No identity, or an identity without a secret (certificate
    authentication): no H is sent."""
    px = await Proxy(shared_server.addrs[0]).start()
    for kw in ({}, {"identity": "billing"}):
        async with lockd.Client([px.addr], **kw) as c:  # type: ignore[arg-type]
            await c.ping()
            assert c.identity == ""
    assert px.requests(proto.OP_HELLO) == []
    await px.close()


async def test_secret_file_and_validation(tmp_path: Path) -> None:
    p = tmp_path / "secret"
    p.write_bytes(b"from-a-file\n")
    f = await Fake().start()
    async with lockd.Client([f.addr], identity="ops", secret_file=p) as c:
        await c.ping()
        assert "from-a-file" not in repr(c)
    assert [h.key for h in f.hellos] == ["ops from-a-file"] * 2
    for kw in (
        {"identity": "bad identity", "secret": "s"},
        {"identity": "x" * 65, "secret": "s"},
        {"identity": "ops", "secret": "a\nb"},
        {"identity": "ops", "secret": "s" * 257},
        {"identity": "ops", "secret": ""},
        {"secret": "s"},
        {"identity": "ops", "secret": "s", "secret_file": p},
    ):
        with pytest.raises(lockd.InvalidArgument):
            lockd.Client([f.addr], **kw)  # type: ignore[arg-type]
    lockd.Client([f.addr], identity="ops", secret="s" * 256)  # the longest secret
    await f.close()


# E 5 and E 6 against the scripted fake.


async def test_refused_hello_fails_what_was_pipelined_behind_it() -> None:
    """The first connection's hello is refused (E 5) once an acquire is
    pipelined behind it: that acquire fails with Unauthenticated and is not
    sent on the other connection, whose hello succeeded."""
    conns: list[FConn] = []
    held: dict[int, FReq] = {}

    def hello(fc: FConn, r: FReq) -> None:
        conns.append(fc)
        if len(conns) == 1:
            held[id(fc)] = r  # answered when a request arrives behind it
        else:
            fc.auto(r)

    def handler(fc: FConn, r: FReq) -> None:
        h = held.pop(id(fc), None)
        if h is not None:
            fc.send(proto.encode_error(proto.OP_HELLO, h.id, proto.CODE_UNAUTHENTICATED, b"unauthenticated"))
            fc.close()
            return
        fc.auto(r)

    f = await Fake(handler, hello=hello).start()
    async with lockd.Client([f.addr], identity="orders", secret="wrong", reconnect_interval=0.2) as c:
        await wait_for("two hellos", lambda: len(conns) == 2)
        await wait_for("two connections", lambda: c.live_connections() == 2)
        refused = None
        for i in range(3):
            try:
                await c.acquire(f"k{i}", wait=2)
            except lockd.Unauthenticated as e:
                refused = e
                break
        assert refused is not None, "no acquire went to the refused connection"
        assert "unauthenticated" in str(refused)
        rs = f.drain()
        bad = [r for r in rs if r.conn is conns[0]]
        assert len(bad) == 1, "the refused acquire was read once, on the refused connection"
        assert all(r.id != bad[0].id for r in rs if r.conn is conns[1]), "resent on another connection"
        await c.acquire("after", wait=2)  # the authenticated connection serves on
    await f.close()


async def test_refused_hello_fails_fast_and_is_definitive() -> None:
    """Every hello refused: the call fails with Unauthenticated, and so do
    calls made while no connection is authenticated, at once — not after
    their wait."""

    def refuse(fc: FConn, r: FReq) -> None:
        fc.send(proto.encode_error(proto.OP_HELLO, r.id, proto.CODE_UNAUTHENTICATED, b"unauthenticated"))
        fc.close()

    f = await Fake(hello=refuse).start()
    async with lockd.Client([f.addr], identity="orders", secret="wrong") as c:
        await wait_for("refused", lambda: len(f.hellos) == 2 and c.live_connections() == 0)
        for call in (c.acquire("k", wait=10), c.release(lockd.Lock("k", 1, 0)), c.ping()):
            start = time.monotonic()
            with pytest.raises(lockd.Unauthenticated):
                await call
            assert time.monotonic() - start < 1
        assert f.drain() == []
    await f.close()


async def test_unauthenticated_request() -> None:
    """No identity, and the server requires one: E 5 to the acquire."""

    def handler(fc: FConn, r: FReq) -> None:
        if r.op == proto.OP_PING:
            fc.auto(r)
            return
        fc.send(proto.encode_error(r.op, r.id, proto.CODE_UNAUTHENTICATED, b"unauthenticated"))
        fc.close()

    f = await Fake(handler).start()
    async with lockd.Client([f.addr]) as c:
        await c.ping()  # a ping is answered on any connection
        with pytest.raises(lockd.Unauthenticated) as ei:
            await c.acquire("k", wait=5)
        assert "requires authentication" in str(ei.value)
        assert len([r for r in f.drain() if r.op == proto.OP_ACQUIRE]) == 1, "sent again"
    await f.close()


async def test_permission_denied() -> None:
    """E 6: a definitive PermissionDenied for that key; the connection stays
    open and serves other keys; a denied release is not retried."""

    def handler(fc: FConn, r: FReq) -> None:
        if r.key.startswith("billing/"):
            fc.send(proto.encode_error(r.op, r.id, proto.CODE_PERMISSION_DENIED, b"permission denied"))
            return
        fc.auto(r)

    f = await Fake(handler).start()
    async with lockd.Client([f.addr], identity="orders", secret="s") as c:
        await wait_for("two connections", lambda: c.live_connections() == 2)
        with pytest.raises(lockd.PermissionDenied) as ei:
            await c.acquire("billing/1", wait=5)
        assert ei.value.key == "billing/1"
        with pytest.raises(lockd.PermissionDenied):
            await c.release(lockd.Lock("billing/2", 9, 0))
        lk = await c.acquire("orders/1", wait=1)
        await c.release(lk)
        assert c.live_connections() == 2 and len(f.conns) == 2
        assert [r.key for r in f.drain()] == ["billing/1", "billing/2", "orders/1", "orders/1"]
    await f.close()


async def test_server_without_hello() -> None:
    """A server that does not know H answers E 1 and closes: a clear error
    naming the hello, not Indeterminate."""

    def old(fc: FConn, r: FReq) -> None:
        fc.send(proto.encode_error(proto.OP_HELLO, 0, proto.CODE_BAD_FRAME, b"unknown op"))
        fc.close()

    f = await Fake(hello=old).start()
    async with lockd.Client([f.addr], identity="orders", secret="s") as c:
        with pytest.raises(lockd.ServerError) as ei:
            await c.acquire("k", wait=2)
        assert "hello" in str(ei.value)
    await f.close()


# TLS through a TLS-terminating proxy in front of a plaintext lockd.


async def test_tls(shared_server: Cluster, certs: Certs) -> None:
    px = await Proxy(shared_server.addrs[0], ssl=server_ctx(certs)).start()
    ctx = lockd.tls_context(ca=str(certs.ca))
    async with lockd.Client([px.addr], ssl=ctx, identity="orders", secret="s") as c:
        lk = await c.acquire("tls/a", wait=1)
        await c.release(lk)
        assert c.identity == "orders"
    assert px.requests(proto.OP_ACQUIRE), "the frames went through the TLS proxy"
    # Another name for the server: server_hostname.
    async with lockd.Client([px.addr], ssl=ctx, server_hostname="localhost") as c:
        await c.ping()
    # The wrong CA: no connection, and the reason says why.
    bad = lockd.tls_context(ca=str(certs.other_ca))
    async with lockd.Client([px.addr], ssl=bad, fail_fast=True) as c:
        with pytest.raises(lockd.NoConnection) as ei:
            await c.ping()
        assert "certificate" in str(ei.value).lower()
    # A name the certificate does not carry.
    async with lockd.Client([px.addr], ssl=ctx, server_hostname="elsewhere", fail_fast=True) as c:
        with pytest.raises(lockd.NoConnection):
            await c.ping()
    # Plaintext to a TLS port.
    async with lockd.Client([px.addr], fail_fast=True, transport_timeout=3) as c:
        with pytest.raises(lockd.NoConnection):
            await c.ping()
    await px.close()


async def test_mutual_tls(shared_server: Cluster, certs: Certs) -> None:
    px = await Proxy(shared_server.addrs[0], ssl=server_ctx(certs, client_ca=True)).start()
    with_cert = lockd.tls_context(ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key))
    async with lockd.Client([px.addr], ssl=with_cert, identity="orders") as c:
        await c.ping()
        lk = await c.acquire("mtls/a", wait=1)
        await c.release(lk)
    without = lockd.tls_context(ca=str(certs.ca))
    async with lockd.Client([px.addr], ssl=without, fail_fast=True, transport_timeout=3) as c:
        with pytest.raises(lockd.NoConnection):
            await c.ping()
    await px.close()
    with pytest.raises(lockd.InvalidArgument):
        lockd.tls_context(key=str(certs.client_key))
    with pytest.raises(lockd.InvalidArgument):
        lockd.Client(["127.0.0.1:1"], server_hostname="x")


# The real server's §8 flags: the binary built by the test run has them, so
# a binary without them fails these tests.


def _need(lockd_help: str, *flags: str) -> None:
    # Go's flag usage lists each flag at the start of a line: "  -acl string".
    have = {line.split()[0].lstrip("-") for line in lockd_help.splitlines() if line.startswith("  -")}
    missing = [f for f in flags if f not in have]
    if missing:
        pytest.fail("the lockd binary has no " + ", ".join("--" + f for f in missing) + " (PROTOCOL.md §8)")


def _sha(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


@pytest.fixture
def acl_server(lockd_bin: str, lockd_help: str, tmp_path: Path) -> Iterator[Cluster]:
    _need(lockd_help, "acl")
    acl = tmp_path / "acl"
    acl.write_text(
        "# identity secret keys role\n"
        f"orders   {_sha('orders-secret')}  orders/,jobs/  client\n"
        f"watcher  {_sha('watcher-secret')}  -  monitor\n"
        f"ops      {_sha('ops secret with spaces')}  *  admin\n"
    )
    c = Cluster(lockd_bin, tmp_path / "data", extra=["--acl", str(acl)]).start()
    yield c
    c.close()


async def test_real_acl(acl_server: Cluster) -> None:
    addrs = acl_server.addrs
    async with lockd.Client(addrs, identity="orders", secret="orders-secret") as c:
        lk = await c.acquire("orders/1", wait=1)
        assert c.identity == "orders"
        with pytest.raises(lockd.PermissionDenied):
            await c.acquire("billing/1", wait=1)
        await c.release(lk)
    async with lockd.Client(addrs, identity="orders", secret="wrong") as c:
        with pytest.raises(lockd.Unauthenticated):
            await c.acquire("orders/2", wait=2)
    async with lockd.Client(addrs) as c:
        await c.ping()  # answered unauthenticated
        with pytest.raises(lockd.Unauthenticated):
            await c.acquire("orders/3", wait=2)
    async with lockd.Client(addrs, identity="watcher", secret="watcher-secret") as c:
        with pytest.raises(lockd.PermissionDenied):
            await c.acquire("orders/4", wait=1)
    async with lockd.Client(addrs, identity="orders", secret="orders-secret") as a, lockd.Client(
        addrs, identity="ops", secret="ops secret with spaces"
    ) as ops:
        lk = await a.acquire("orders/5", wait=1)
        async with lockd.Client(addrs, identity="orders", secret="orders-secret") as same:
            await same.renew(lk)  # the same identity may
        await ops.release(lk)  # an admin's forced release
        with pytest.raises(lockd.NotHeld):
            await a.release(lk)


async def test_real_tls(lockd_bin: str, lockd_help: str, tmp_path: Path, certs: Certs) -> None:
    _need(lockd_help, "tls-cert", "tls-key")
    srv = Cluster(lockd_bin, tmp_path, extra=["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]).start()
    try:
        async with lockd.Client(srv.addrs, ssl=lockd.tls_context(ca=str(certs.ca))) as c:
            lk = await c.acquire("tls/real", wait=1)
            await c.release(lk)
        async with lockd.Client(srv.addrs, fail_fast=True, transport_timeout=3) as c:
            with pytest.raises(lockd.NoConnection):
                await c.ping()
    finally:
        srv.close()


async def test_real_mutual_tls_identity(lockd_bin: str, lockd_help: str, tmp_path: Path, certs: Certs) -> None:
    _need(lockd_help, "acl", "tls-cert", "tls-client-ca")
    acl = tmp_path / "acl"
    acl.write_text(f"{certs.client_cn} cert orders/ client\n")
    srv = Cluster(
        lockd_bin,
        tmp_path / "data",
        extra=["--acl", str(acl), "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
               "--tls-client-ca", str(certs.ca)],
    ).start()
    try:
        ctx = lockd.tls_context(ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key))
        async with lockd.Client(srv.addrs, ssl=ctx, identity=certs.client_cn) as c:
            lk = await c.acquire("orders/cert", wait=1)
            await c.release(lk)
            with pytest.raises(lockd.PermissionDenied):
                await c.acquire("jobs/cert", wait=1)
    finally:
        srv.close()


def test_tls_context_defaults(certs: Certs) -> None:
    ctx = lockd.tls_context(ca=str(certs.ca))
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED


async def test_e5_on_any_member_is_not_followed() -> None:
    """A member that is not the active answers an unauthenticated acquire
    E 5, not M (§8.3's validation order): the client does not go looking
    for the active."""
    other = await Fake().start()

    def member(fc: FConn, r: FReq) -> None:
        fc.send(proto.encode_error(r.op, r.id, proto.CODE_UNAUTHENTICATED, b"unauthenticated"))
        fc.close()

    m = await Fake(member).start()
    async with lockd.Client([m.addr], conns_per_addr=1) as c:
        with pytest.raises(lockd.Unauthenticated):
            await c.acquire("k", wait=2)
    assert other.conns == []
    await m.close()
    await other.close()


async def test_connection_stays_after_e6_on_pipelined_requests() -> None:
    """Requests pipelined with a denied one are answered on the same
    connection."""

    def handler(fc: FConn, r: FReq) -> None:
        if r.key == "denied":
            fc.send(proto.encode_error(r.op, r.id, proto.CODE_PERMISSION_DENIED, b"permission denied"))
        else:
            fc.auto(r)

    f = await Fake(handler).start()
    async with lockd.Client([f.addr], conns_per_addr=1) as c:
        res = await asyncio.gather(*(c.acquire("denied" if i % 2 else f"ok{i}", wait=1) for i in range(10)), return_exceptions=True)
        assert sum(isinstance(r, lockd.PermissionDenied) for r in res) == 5
        assert sum(isinstance(r, lockd.Lock) for r in res) == 5
        assert len(f.conns) == 1
    await f.close()
