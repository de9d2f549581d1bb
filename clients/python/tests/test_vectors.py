"""The Python codec against proto/testdata/vectors.json, the file the Go codec's
tests (proto/vectors_test.go) read too: the two cannot drift."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from harness import repo_path
from lockd import proto
from lockd._conn import Conn
from lockd._request import RES_ANSWER, SENT, Req

VECTORS: dict[str, Any] = json.loads(repo_path("proto/testdata/vectors.json").read_text("utf-8"))


def _id(v: dict[str, Any]) -> str:
    return str(v["name"])


def test_every_op_and_code_covered() -> None:
    req_ops = {v["op"] for v in VECTORS["requests"]}
    assert req_ops == {"A", "R", "K", "P", "H"}
    resp_ops = {v["op"] for v in VECTORS["responses"]}
    assert resp_ops == {"A", "T", "B", "R", "K", "N", "P", "M", "E", "H"}
    codes = {v["code"] for v in VECTORS["responses"] if v["op"] == "E"}
    assert codes >= {1, 2, 3, 4, 5, 6}
    assert {v["code"] for v in VECTORS["bad_requests"]} == {1, 2, 3}


@pytest.mark.parametrize("v", VECTORS["requests"], ids=_id)
def test_request(v: dict[str, Any]) -> None:
    raw = bytes.fromhex(v["hex"])
    got = proto.parse_request(raw)
    assert got is not None
    end, r, code = got
    assert (end, code) == (len(raw), 0)
    assert r == proto.Request(ord(v["op"]), v["wait"], v["lease"], v["id"], v["key"].encode())
    key = v["key"].encode()
    op = ord(v["op"])
    if op == proto.OP_ACQUIRE:
        enc = proto.encode_acquire(v["wait"], v["lease"], v["id"], key)
    elif op == proto.OP_RELEASE:
        enc = proto.encode_release(v["id"], key)
    elif op == proto.OP_RENEW:
        enc = proto.encode_renew(v["lease"], v["id"], key)
    elif op == proto.OP_PING:
        enc = proto.encode_ping(v["id"])
    else:
        enc = proto.encode_hello(v["id"], key)
    assert enc == raw
    # The client's own encoder (the wire wait aside) writes the same bytes.
    if op in (proto.OP_RELEASE, proto.OP_RENEW, proto.OP_PING):
        q = Req(op, v["key"], key, v["id"], v["lease"])
        assert q.encode(0.0) == raw
    if op == proto.OP_ACQUIRE and v["wait"] == 0:
        q = Req(op, v["key"], key, v["id"], v["lease"])
        q.wait0 = True
        assert q.encode(0.0) == raw


@pytest.mark.parametrize("v", VECTORS["bad_requests"], ids=_id)
def test_bad_request(v: dict[str, Any]) -> None:
    raw = bytes.fromhex(v["hex"])
    max_key = v.get("max_key", proto.MAX_KEY)
    if v["code"] == proto.CODE_BAD_FRAME:
        with pytest.raises(proto.FrameError) as ei:
            proto.parse_request(raw, 0, max_key)
        assert (ei.value.op, ei.value.id) == (ord(v["op"]), v["id"])
        return
    got = proto.parse_request(raw, 0, max_key)
    assert got is not None
    end, r, code = got
    assert (end, code, r.op, r.id) == (len(raw), v["code"], ord(v["op"]), v["id"])


@pytest.mark.parametrize("h", VECTORS["incomplete_requests"])
def test_incomplete_request(h: str) -> None:
    assert proto.parse_request(bytes.fromhex(h)) is None


@pytest.mark.parametrize("v", VECTORS["responses"], ids=_id)
def test_response(v: dict[str, Any]) -> None:
    raw = bytes.fromhex(v["hex"])
    got = proto.parse_response(raw)
    assert got is not None
    end, r = got
    assert end == len(raw)
    req_op = ord(v["req_op"]) if v["req_op"] else 0
    assert r == proto.Response(ord(v["op"]), req_op, v["id"], v["token"], v["code"], v["tail"].encode())
    tail = v["tail"].encode()
    op = ord(v["op"])
    enc = {
        proto.OP_ACQUIRE: lambda: proto.encode_acquired(v["id"], v["token"], tail),
        proto.OP_TIMEOUT: lambda: proto.encode_timeout(v["id"], tail),
        proto.OP_BUSY: lambda: proto.encode_busy(v["id"], tail),
        proto.OP_RELEASE: lambda: proto.encode_released(v["id"], tail),
        proto.OP_RENEW: lambda: proto.encode_renewed(v["id"], tail),
        proto.OP_NOT_HELD: lambda: proto.encode_not_held(req_op, v["id"], tail),
        proto.OP_PING: lambda: proto.encode_pong(v["id"]),
        proto.OP_MOVED: lambda: proto.encode_moved(req_op, v["id"], tail),
        proto.OP_ERROR: lambda: proto.encode_error(req_op, v["id"], v["code"], tail),
        proto.OP_HELLO: lambda: proto.encode_welcome(v["id"], tail),
    }[op]()
    assert enc == raw


@pytest.mark.parametrize("v", VECTORS["bad_responses"], ids=_id)
def test_bad_response(v: dict[str, Any]) -> None:
    with pytest.raises(proto.FrameError) as ei:
        proto.parse_response(bytes.fromhex(v["hex"]))
    assert (ei.value.op, ei.value.id) == (ord(v["op"]), v["id"])


@pytest.mark.parametrize("h", VECTORS["incomplete_responses"])
def test_incomplete_response(h: str) -> None:
    assert proto.parse_response(bytes.fromhex(h)) is None


class _StubOwner:
    """A connection's owner (lockd._conn.Owner) that records nothing, for
    feeding the connection bytes directly."""

    def conn_heard(self, conn: Conn) -> None:
        pass

    def conn_welcomed(self, conn: Conn) -> None:
        pass

    def conn_refused(self, conn: Conn, err: BaseException) -> None:
        pass

    def conn_wrote(self, conn: Conn) -> None:
        pass

    def conn_ended(self, conn: Conn) -> None:
        pass

    def late_grant(self, key: str, token: int) -> None:
        raise AssertionError("no grant here is late")


async def test_reader_split_at_every_offset() -> None:
    """The client's reader hands every answer of the vectors to its request
    whatever the cut of the stream: every frame split at every offset."""
    loop = asyncio.get_running_loop()
    answers = [v for v in VECTORS["responses"] if v["op"] != "H" and v["req_op"] != "H" and not (v["op"] == "E" and v["code"] in (1, 5))]
    stream = b"".join(bytes.fromhex(v["hex"]) for v in answers)
    table_op = {"A": "A", "T": "A", "B": "A", "R": "R", "K": "K", "P": "P"}
    for cut in range(len(stream) + 1):
        c = Conn(_StubOwner(), loop, "test", None, 0, 5.0)
        reqs = []
        for v in answers:
            op = table_op.get(v["op"]) or v["req_op"]
            r = Req(ord(op), "k", b"k", v["id"], 1)
            r.conn = c
            r.state = SENT
            r.fut = loop.create_future()
            table = c.pend[r.op]
            head = table.get(r.id)
            if head is None:
                table[r.id] = r
            else:
                while head.next is not None:
                    head = head.next
                head.next = r
            reqs.append((v, r))
        c.data_received(stream[:cut])
        c.data_received(stream[cut:])
        assert not c.dead, f"cut {cut}: connection failed: {c.cause}"
        for v, r in reqs:
            assert r.res == RES_ANSWER, f"cut {cut}: {v['name']}: not answered"
            assert chr(r.rop) == v["op"], f"cut {cut}: {v['name']}"
            assert r.rtoken == v["token"] and r.rcode == v["code"]
            if v["op"] in ("M", "E"):
                assert r.rtail == v["tail"]
