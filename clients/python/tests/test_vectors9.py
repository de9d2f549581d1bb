"""The Python codec against proto/testdata/vectors9.json, the §9 frames
(acquire shared, validate, watch, inspect, the pushed L, error codes 7 and 8)
that the Go codec's tests (proto/vectors_test.go) read too: every vector
parses to its fields and encodes back to its bytes, and the client's reader
hands every §9 answer to its request or watch whatever the cut of the
stream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from harness import repo_path
from lockd import proto
from lockd._conn import Conn
from lockd._request import RES_ANSWER, SENT, Req, WatchReg

VECTORS: dict[str, Any] = json.loads(repo_path("proto/testdata/vectors9.json").read_text("utf-8"))


def _id(v: dict[str, Any]) -> str:
    return str(v["name"])


def test_every_op_and_code_covered() -> None:
    """The file holds every §9 request and answer, both new codes and every
    reason: a vector dropped from it would leave a frame untested here."""
    assert {v["op"] for v in VECTORS["requests"]} == {"S", "V", "W", "I"}
    assert {v["op"] for v in VECTORS["responses"]} >= {"V", "W", "L", "I", "N", "E"}
    assert {v["req_op"] for v in VECTORS["responses"] if v["op"] == "N"} == {"V", "W"}
    assert {v["code"] for v in VECTORS["responses"] if v["op"] == "E"} == {7, 8}
    assert {v["reason"] for v in VECTORS["responses"] if v["op"] == "L"} == {1, 2, 3, 4}
    assert {v["code"] for v in VECTORS["bad_requests"]} == {1, 2, 3, 7}
    assert {v["op"] for v in VECTORS["bad_requests"]} >= {"S", "V", "W", "I"}


@pytest.mark.parametrize("v", VECTORS["requests"], ids=_id)
def test_request(v: dict[str, Any]) -> None:
    raw = bytes.fromhex(v["hex"])
    got = proto.parse_request(raw)
    assert got is not None
    end, r, code = got
    assert (end, code) == (len(raw), 0)
    key = v["key"].encode()
    assert r == proto.Request(ord(v["op"]), v["wait"], v["lease"], v["id"], key, v["limit"])
    op = ord(v["op"])
    if op == proto.OP_SHARED:
        enc = proto.encode_shared(v["wait"], v["lease"], v["id"], v["limit"], key)
    elif op == proto.OP_VALIDATE:
        enc = proto.encode_validate(v["id"], key)
    elif op == proto.OP_WATCH:
        enc = proto.encode_watch(v["id"], key)
    else:
        assert op == proto.OP_INSPECT
        enc = proto.encode_inspect(v["id"], key)
    assert enc == raw
    # The client's own encoder (the wire wait aside) writes the same bytes.
    q = Req(op, v["key"], key, v["id"], v["lease"])
    q.limit = v["limit"]
    if op == proto.OP_SHARED:
        if v["wait"] != 0:
            return
        q.wait0 = True
    assert q.encode(0.0) == raw


def test_shared_wire_wait() -> None:
    """An acquire shared's wire wait is computed at the send, like an
    acquire's: the time left rounded up, capped at 255."""
    for left, wire in ((0.001, 1), (2.5, 3), (300.0, 255)):
        q = Req(proto.OP_SHARED, "k", b"k", 9, 30)
        q.limit = 4
        q.wait_end = 100.0 + left
        assert q.encode(100.0) == proto.encode_shared(wire, 30, 9, 4, b"k")


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


def _encode_response(v: dict[str, Any]) -> bytes:
    tail = v["tail"].encode()
    req_op = ord(v["req_op"]) if v["req_op"] else 0
    op = ord(v["op"])
    if op == proto.OP_VALIDATE:
        return proto.encode_valid(v["id"], v["remaining"], tail)
    if op == proto.OP_WATCH:
        return proto.encode_watching(v["id"], tail)
    if op == proto.OP_LOST:
        return proto.encode_lost(v["id"], v["reason"], tail)
    if op == proto.OP_INSPECT:
        return proto.encode_inspection(
            v["id"], v["holders"], v["limit"], v["waiters"], v["token"], v["remaining"], tail
        )
    if op == proto.OP_NOT_HELD:
        return proto.encode_not_held(req_op, v["id"], tail)
    if op == proto.OP_MOVED:
        return proto.encode_moved(req_op, v["id"], tail)
    assert op == proto.OP_ERROR, v["op"]
    return proto.encode_error(req_op, v["id"], v["code"], tail)


@pytest.mark.parametrize("v", VECTORS["responses"], ids=_id)
def test_response(v: dict[str, Any]) -> None:
    raw = bytes.fromhex(v["hex"])
    got = proto.parse_response(raw)
    assert got is not None
    end, r = got
    assert end == len(raw)
    req_op = ord(v["req_op"]) if v["req_op"] else 0
    assert r == proto.Response(
        ord(v["op"]),
        req_op,
        v["id"],
        v["token"],
        v["code"],
        v["tail"].encode(),
        v["reason"],
        v["remaining"],
        v["holders"],
        v["limit"],
        v["waiters"],
    )
    assert _encode_response(v) == raw


@pytest.mark.parametrize("v", VECTORS["bad_responses"], ids=_id)
def test_bad_response(v: dict[str, Any]) -> None:
    with pytest.raises(proto.FrameError) as ei:
        proto.parse_response(bytes.fromhex(v["hex"]))
    assert (ei.value.op, ei.value.id) == (ord(v["op"]), v["id"])


@pytest.mark.parametrize("h", VECTORS["incomplete_responses"])
def test_incomplete_response(h: str) -> None:
    assert proto.parse_response(bytes.fromhex(h)) is None


def test_op_names() -> None:
    assert [proto.op_name(o) for o in (proto.OP_SHARED, proto.OP_VALIDATE, proto.OP_WATCH, proto.OP_INSPECT, proto.OP_LOST)] == [
        "acquire-shared",
        "validate",
        "watch",
        "inspect",
        "lost",
    ]


class _StubOwner:
    """A connection's owner (lockd._conn.Owner) that records nothing."""

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

    def unsupported(self, conn: Conn, op: int, msg: str) -> None:
        raise AssertionError("no E 1 here")


# Which pending table a request of each answer waits in.
_TABLE = {"V": "V", "W": "W", "I": "I"}


async def test_reader_split_at_every_offset() -> None:
    """Every §9 answer of the vectors reaches its request — a V its
    validate, a W its watch (which registers), an I its inspect, N, M and E
    theirs by the op they carry — and every L the watch it ends, whatever
    the cut of the stream: every frame split at every offset."""
    loop = asyncio.get_running_loop()
    # The watching answer is sent once per L, so that each L finds the
    # registration it ends.
    answers = [v for v in VECTORS["responses"] if v["op"] not in ("L", "W")]
    (watching,) = [v for v in VECTORS["responses"] if v["op"] == "W"]
    lost = [v for v in VECTORS["responses"] if v["op"] == "L"]
    assert {(v["id"], v["tail"]) for v in lost} == {(watching["id"], watching["tail"])}
    stream = b"".join(bytes.fromhex(v["hex"]) for v in answers)
    stream += bytes.fromhex(watching["hex"]) * len(lost)
    stream += b"".join(bytes.fromhex(v["hex"]) for v in lost)
    for cut in range(len(stream) + 1):
        c = Conn(_StubOwner(), loop, "test", None, 0, 5.0)  # type: ignore[arg-type]
        reqs: list[tuple[dict[str, Any], Req]] = []
        ended: list[tuple[int, int]] = []

        def add(op: str, ident: int) -> Req:
            r = Req(ord(op), "k", b"k", ident, 1)
            r.conn = c
            r.state = SENT
            r.fut = loop.create_future()
            c._add_pending(c.pend[Conn.table_of(r.op)], r)
            return r

        for v in answers:
            op = _TABLE.get(v["op"]) or v["req_op"]
            reqs.append((v, add(op, v["id"])))
        for v in lost:
            r = add("W", v["id"])
            r.reg = WatchReg(lambda reason, err, t=v["id"]: ended.append((t, reason)))
        c.wflight = sum(1 for _, r in reqs if r.op == proto.OP_WATCH) + len(lost)  # as if written
        c.data_received(stream[:cut])
        c.data_received(stream[cut:])
        assert not c.dead, f"cut {cut}: connection failed: {c.cause}"
        for v, r in reqs:
            assert r.res == RES_ANSWER, f"cut {cut}: {v['name']}: not answered"
            assert chr(r.rop) == v["op"], f"cut {cut}: {v['name']}"
            assert r.rcode == v["code"], f"cut {cut}: {v['name']}"
            if v["op"] == "V":
                assert r.rremain == v["remaining"]
            if v["op"] == "I":
                assert (r.rtoken, r.rinsp) == (v["token"], (v["holders"], v["limit"], v["waiters"], v["remaining"]))
            if v["op"] in ("M", "E"):
                assert r.rtail == v["tail"]
        assert sorted(ended) == sorted((v["id"], v["reason"]) for v in lost), f"cut {cut}"
        assert (c.nreg, c.wflight, c.watches) == (0, 0, {}), f"cut {cut}: watches counted after every L"
