"""The Python codec against proto/testdata/vectors9.json, the §9 frames
(acquire shared, validate, watch, inspect, the pushed L, error codes 7 and 8)
that the Go codec's tests (proto/vectors_test.go) read too: every vector
parses to its fields and encodes back to its bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness import repo_path
from lockd import proto

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
