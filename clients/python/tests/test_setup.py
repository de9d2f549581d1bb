"""Connections the server refuses before it reads a request — a plaintext
client on a TLS port, a client without a certificate against mutual TLS, a
server at its ``--max-conns`` — fail a call with :class:`lockd.NoConnection`
whose ``cause`` says why (:class:`lockd.Rejected`, or the ``ssl`` error),
never with :class:`lockd.Indeterminate`: the server executed nothing."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path
from typing import Iterator

import pytest

import lockd
from harness import Certs, Cluster, Fake, FConn, FReq, make_certs
from lockd import proto


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_server(lockd_bin: str, tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Cluster]:
    c = Cluster(
        lockd_bin,
        tmp_path_factory.mktemp("tls"),
        extra=["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), "--tls-client-ca", str(certs.ca)],
    ).start()
    yield c
    c.close()


@pytest.fixture
def full_server(lockd_bin: str, tmp_path: Path) -> Iterator[Cluster]:
    """A lockd at --max-conns 1 whose one connection this test holds."""
    c = Cluster(lockd_bin, tmp_path, extra=["--max-conns", "1"]).start()
    host, port = c.addrs[0].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(proto.encode_ping(1))
    assert s.recv(64) == proto.encode_pong(1)
    yield c
    s.close()
    c.close()


def _quick(addrs: list[str], **kw: object) -> lockd.Client:
    return lockd.Client(addrs, transport_timeout=1.5, **kw)  # type: ignore[arg-type]


async def _acquire_fails(c: lockd.Client, wait: float) -> lockd.NoConnection:
    try:
        await c.acquire(f"setup/{wait}", wait=wait)
    except lockd.NoConnection as e:
        assert not isinstance(e, lockd.Indeterminate)
        return e
    except lockd.Indeterminate as e:
        pytest.fail(f"wait={wait}: Indeterminate for a connection refused before any request was read: {e}")
    pytest.fail(f"wait={wait}: acquired through a refused connection")


@pytest.mark.timeout(40)
async def test_plaintext_client_on_tls_port(tls_server: Cluster) -> None:
    async with _quick(tls_server.addrs) as c:
        for wait in (0, 1):
            e = await _acquire_fails(c, wait)
            assert isinstance(e.cause, lockd.Rejected), repr(e.cause)
            assert "TLS" in str(e), e


@pytest.mark.timeout(40)
async def test_client_without_certificate_against_mutual_tls(tls_server: Cluster, certs: Certs) -> None:
    ctx = lockd.tls_context(ca=str(certs.ca))
    async with _quick(tls_server.addrs, ssl=ctx) as c:
        for wait in (0, 1):
            e = await _acquire_fails(c, wait)
            assert isinstance(e.cause, ssl.SSLError), repr(e.cause)
    ok = lockd.tls_context(ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key))
    async with _quick(tls_server.addrs, ssl=ok) as c:
        await c.release(await c.acquire("setup/ok", wait=1))


@pytest.mark.timeout(40)
async def test_server_at_max_conns(full_server: Cluster) -> None:
    """Fresh clients, so that the first call races the server's close of
    each new connection (written before or after it arrives)."""
    for i in range(20):
        async with _quick(full_server.addrs, fail_fast=True) as c:
            e = await _acquire_fails(c, i % 2)
            assert isinstance(e.cause, lockd.Rejected), repr(e.cause)
            assert "--max-conns" in str(e)


async def test_tls_port_answering_plaintext_with_e1() -> None:
    """A TLS port that answers a plaintext first record with one plaintext
    E 1 saying it speaks TLS, then closes: that is the cause, at once."""

    def tls_port(fc: FConn, r: FReq) -> None:
        fc.send(proto.encode_error(r.op, 0, proto.CODE_BAD_FRAME, b"this port speaks TLS: connect with TLS"))
        fc.close()

    f = await Fake(probe=tls_port).start()
    async with lockd.Client([f.addr]) as c:
        t0 = time.monotonic()
        e = await _acquire_fails(c, 5)
        assert time.monotonic() - t0 < 1, "waited out the deadline for a refusal that will not change"
        assert isinstance(e.cause, lockd.Rejected) and "speaks TLS" in str(e.cause), repr(e.cause)
    await f.close()
