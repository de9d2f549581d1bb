"""The lockd wire codec (PROTOCOL.md §1–§3, §8.3, §9): frame encoders and parsers.

Every frame, in both directions, is ``op (1 byte) | fixed header | tail |
0x0A``; integers are unsigned big-endian. The fixed header may contain 0x0A,
so a parser consumes ``1 + len(header)`` bytes by count before it looks for
the newline.

The encoders return one whole frame as :class:`bytes` and do not validate
their arguments (the client validates before it encodes). The parsers mirror
the Go package ``proto`` byte for byte; ``proto/testdata/vectors.json`` and
``proto/testdata/vectors9.json`` (§9) in the repository hold the frames both
implementations are tested against.

This module is what :class:`lockd.Client` speaks; it is public so that tests,
fakes and tools can speak the protocol too.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = [
    "OP_ACQUIRE",
    "OP_RELEASE",
    "OP_RENEW",
    "OP_PING",
    "OP_HELLO",
    "OP_TIMEOUT",
    "OP_BUSY",
    "OP_NOT_HELD",
    "OP_MOVED",
    "OP_ERROR",
    "OP_SHARED",
    "OP_VALIDATE",
    "OP_WATCH",
    "OP_INSPECT",
    "OP_LOST",
    "CODE_BAD_FRAME",
    "CODE_BAD_KEY",
    "CODE_BAD_LEASE",
    "CODE_SHUTDOWN",
    "CODE_UNAUTHENTICATED",
    "CODE_PERMISSION_DENIED",
    "CODE_LIMIT_MISMATCH",
    "CODE_LIMIT_REACHED",
    "REASON_RELEASED",
    "REASON_EXPIRED",
    "REASON_FORCED",
    "REASON_CANNOT_TELL",
    "MAX_KEY",
    "MAX_WAIT",
    "MAX_SECRET",
    "MAX_LIMIT",
    "REQUEST_HEADER_LEN",
    "RESPONSE_HEADER_LEN",
    "FrameError",
    "Request",
    "Response",
    "encode_acquire",
    "encode_release",
    "encode_renew",
    "encode_ping",
    "encode_hello",
    "encode_shared",
    "encode_validate",
    "encode_watch",
    "encode_inspect",
    "encode_acquired",
    "encode_timeout",
    "encode_busy",
    "encode_released",
    "encode_renewed",
    "encode_not_held",
    "encode_pong",
    "encode_moved",
    "encode_error",
    "encode_welcome",
    "encode_valid",
    "encode_watching",
    "encode_lost",
    "encode_inspection",
    "parse_request",
    "parse_response",
    "op_name",
]

OP_ACQUIRE = 0x41
"""``A``: request acquire; response acquired."""
OP_RELEASE = 0x52
"""``R``: request release; response released."""
OP_RENEW = 0x4B
"""``K``: request renew; response renewed."""
OP_PING = 0x50
"""``P``: request ping; response pong."""
OP_HELLO = 0x48
"""``H``: request hello (§8.3); response welcome."""
OP_TIMEOUT = 0x54
"""``T``: response: the wait ended, nothing granted."""
OP_BUSY = 0x42
"""``B``: response: queue or capacity full, nothing granted or queued."""
OP_NOT_HELD = 0x4E
"""``N``: response: the token is not the key's current grant."""
OP_MOVED = 0x4D
"""``M``: response: not the active/leader; the request was not executed."""
OP_ERROR = 0x45
"""``E``: response: the request was rejected and not executed."""
OP_SHARED = 0x53
"""``S`` (§9): request acquire shared, answered like an acquire (A, T, B)."""
OP_VALIDATE = 0x56
"""``V`` (§9): request validate; response valid, with the lease time left."""
OP_WATCH = 0x57
"""``W`` (§9): request watch; response watching."""
OP_INSPECT = 0x49
"""``I`` (§9): request inspect; response inspection."""
OP_LOST = 0x4C
"""``L`` (§9): response, pushed once per watch: the watched grant ended."""

CODE_BAD_FRAME = 1
"""E code 1: unknown op or no 0x0A within the longest legal frame; the server closes."""
CODE_BAD_KEY = 2
"""E code 2: key empty, too long or not UTF-8."""
CODE_BAD_LEASE = 3
"""E code 3: lease 0."""
CODE_SHUTDOWN = 4
"""E code 4: the server is shutting down."""
CODE_UNAUTHENTICATED = 5
"""E code 5 (§8.3): not authenticated; the server closes the connection."""
CODE_PERMISSION_DENIED = 6
"""E code 6 (§8.3): the identity may not act on that key."""
CODE_LIMIT_MISMATCH = 7
"""E code 7 (§9): an acquire shared with limit 0, or a limit other than the key's holders'."""
CODE_LIMIT_REACHED = 8
"""E code 8 (§9): a watch beyond the connection's bound of watches."""

REASON_RELEASED = 1
"""L reason 1: the grant was released (by any connection)."""
REASON_EXPIRED = 2
"""L reason 2: the grant's lease ended."""
REASON_FORCED = 3
"""L reason 3: released by an admin identity or the admin endpoint (forced)."""
REASON_CANNOT_TELL = 4
"""L reason 4: this member can no longer tell (shutting down, stepping down,
demoted, frozen); the grant may live on at the new active/leader."""

MAX_KEY = 1024
"""Longest key, and longest tail of any frame, in bytes."""
MAX_WAIT = 255
"""Longest wait, and longest lease, in seconds."""
MAX_SECRET = 256
"""Longest secret in a hello, in bytes (§8.3)."""
MAX_LIMIT = 65535
"""Largest limit of an acquire shared (§9; 0 is refused with E 7)."""

REQUEST_HEADER_LEN: dict[int, int] = {
    OP_ACQUIRE: 10,  # wait u8, lease u8, owner u64
    OP_RELEASE: 8,  # token u64
    OP_RENEW: 9,  # lease u8, token u64
    OP_PING: 8,  # nonce u64
    OP_HELLO: 8,  # nonce u64
    OP_SHARED: 12,  # wait u8, lease u8, owner u64, limit u16
    OP_VALIDATE: 8,  # token u64
    OP_WATCH: 8,  # token u64
    OP_INSPECT: 8,  # nonce u64
}
"""Fixed header length of each request op."""

RESPONSE_HEADER_LEN: dict[int, int] = {
    OP_ACQUIRE: 16,  # owner u64, token u64
    OP_TIMEOUT: 8,  # owner u64
    OP_BUSY: 8,  # owner u64
    OP_RELEASE: 8,  # token u64
    OP_RENEW: 8,  # token u64
    OP_NOT_HELD: 9,  # op u8, token u64
    OP_PING: 8,  # nonce u64
    OP_MOVED: 9,  # op u8, id u64
    OP_ERROR: 10,  # op u8, id u64, code u8
    OP_HELLO: 8,  # nonce u64
    OP_VALIDATE: 12,  # token u64, remaining u32
    OP_WATCH: 8,  # token u64
    OP_LOST: 9,  # token u64, reason u8
    OP_INSPECT: 28,  # nonce u64, holders u16, limit u16, waiters u32, token u64, remaining u32
}
"""Fixed header length of each response op."""

# Lookup tables by op byte: 0 marks an unknown op.
_REQ_HL = bytes(REQUEST_HEADER_LEN.get(i, 0) for i in range(256))
_RESP_HL = bytes(RESPONSE_HEADER_LEN.get(i, 0) for i in range(256))

_U64 = struct.Struct(">Q")
_U64U64 = struct.Struct(">QQ")
_B_U64 = struct.Struct(">BQ")
_B_U64_B = struct.Struct(">BQB")
_OP_U64 = struct.Struct(">BQ")
_OP_B_B_U64 = struct.Struct(">BBBQ")
_OP_B_U64 = struct.Struct(">BBQ")
_OP_U64U64 = struct.Struct(">BQQ")
_OP_B_U64_B = struct.Struct(">BBQB")
_OP_B_B_U64_H = struct.Struct(">BBBQH")
_OP_U64_I = struct.Struct(">BQI")
_OP_U64_B = struct.Struct(">BQB")
_OP_INSPECTION = struct.Struct(">BQHHIQI")
_U64_H = struct.Struct(">QH")
_U32 = struct.Struct(">I")
_INSPECTION = struct.Struct(">HHIQI")

_NAMES = {
    OP_ACQUIRE: "acquire",
    OP_RELEASE: "release",
    OP_RENEW: "renew",
    OP_PING: "ping",
    OP_HELLO: "hello",
    OP_TIMEOUT: "timeout",
    OP_BUSY: "busy",
    OP_NOT_HELD: "not-held",
    OP_MOVED: "moved",
    OP_ERROR: "error",
    OP_SHARED: "acquire-shared",
    OP_VALIDATE: "validate",
    OP_WATCH: "watch",
    OP_INSPECT: "inspect",
    OP_LOST: "lost",
}


def op_name(op: int) -> str:
    """Return the name of op byte ``op`` ("acquire", "moved", ... or "op(0x07)").

    The letters shared by a request and a response (A, R, K, P, H, V, W, I)
    are named after the request, as in Go's ``proto.Op.String``.
    """
    name = _NAMES.get(op)
    if name is not None:
        return name
    return f"op(0x{op:02x})"


class FrameError(ValueError):
    """Bytes that cannot be a frame (E code 1): framing is lost.

    ``op`` is the byte read as op; ``id`` is the header's id field when the
    whole fixed header was read, else 0.
    """

    def __init__(self, msg: str, op: int, ident: int = 0) -> None:
        super().__init__(msg)
        self.op = op
        self.id = ident


class Request(NamedTuple):
    """One decoded request frame.

    ``id`` is the owner (A, S), token (R, K, V, W) or nonce (P, H, I);
    ``key`` is the tail: the key of A/R/K/S/V/W/I, the ``identity secret``
    of H, ``b""`` for P. ``wait``, ``lease`` and ``limit`` (S) are 0 where
    the op has none.
    """

    op: int
    wait: int
    lease: int
    id: int
    key: bytes
    limit: int = 0


class Response(NamedTuple):
    """One decoded response frame.

    ``req_op`` is the answered request's op for N, M and E (else 0); ``id``
    the owner (A, T, B), token (R, K, N, V, W, L), nonce (P, H, I) or the
    request's id (M, E); ``token`` the granted token of A or the newest
    holder's token of I (else 0); ``code`` the E code (else 0); ``tail`` the
    key, the active's address (M), the message (E), the identity (H) or
    ``b""`` (P). The §9 fields are 0 where the op has none: ``reason`` of L
    (as read, unchecked), ``remaining`` (V, I: lease time left in ms,
    rounded down), ``holders``, ``limit`` and ``waiters`` of I.
    """

    op: int
    req_op: int
    id: int
    token: int
    code: int
    tail: bytes
    reason: int = 0
    remaining: int = 0
    holders: int = 0
    limit: int = 0
    waiters: int = 0


# Request encoders.


def encode_acquire(wait: int, lease: int, owner: int, key: bytes) -> bytes:
    """Return an acquire request: ``A wait lease owner key \\n``."""
    return _OP_B_B_U64.pack(OP_ACQUIRE, wait, lease, owner) + key + b"\n"


def encode_release(token: int, key: bytes) -> bytes:
    """Return a release request: ``R token key \\n``."""
    return _OP_U64.pack(OP_RELEASE, token) + key + b"\n"


def encode_renew(lease: int, token: int, key: bytes) -> bytes:
    """Return a renew request: ``K lease token key \\n``."""
    return _OP_B_U64.pack(OP_RENEW, lease, token) + key + b"\n"


def encode_ping(nonce: int) -> bytes:
    """Return a ping request: ``P nonce \\n``."""
    return _OP_U64.pack(OP_PING, nonce) + b"\n"


def encode_hello(nonce: int, tail: bytes) -> bytes:
    """Return a hello request (§8.3): ``H nonce identity[ secret] \\n``."""
    return _OP_U64.pack(OP_HELLO, nonce) + tail + b"\n"


def encode_shared(wait: int, lease: int, owner: int, limit: int, key: bytes) -> bytes:
    """Return an acquire shared request (§9): ``S wait lease owner limit key \\n``."""
    return _OP_B_B_U64_H.pack(OP_SHARED, wait, lease, owner, limit) + key + b"\n"


def encode_validate(token: int, key: bytes) -> bytes:
    """Return a validate request (§9): ``V token key \\n``."""
    return _OP_U64.pack(OP_VALIDATE, token) + key + b"\n"


def encode_watch(token: int, key: bytes) -> bytes:
    """Return a watch request (§9): ``W token key \\n``."""
    return _OP_U64.pack(OP_WATCH, token) + key + b"\n"


def encode_inspect(nonce: int, key: bytes) -> bytes:
    """Return an inspect request (§9): ``I nonce key \\n``."""
    return _OP_U64.pack(OP_INSPECT, nonce) + key + b"\n"


# Response encoders (for servers, fakes and tests).


def encode_acquired(owner: int, token: int, key: bytes) -> bytes:
    """Return an A (acquired) response."""
    return _OP_U64U64.pack(OP_ACQUIRE, owner, token) + key + b"\n"


def encode_timeout(owner: int, key: bytes) -> bytes:
    """Return a T (timed out) response."""
    return _OP_U64.pack(OP_TIMEOUT, owner) + key + b"\n"


def encode_busy(owner: int, key: bytes) -> bytes:
    """Return a B (busy) response."""
    return _OP_U64.pack(OP_BUSY, owner) + key + b"\n"


def encode_released(token: int, key: bytes) -> bytes:
    """Return an R (released) response."""
    return _OP_U64.pack(OP_RELEASE, token) + key + b"\n"


def encode_renewed(token: int, key: bytes) -> bytes:
    """Return a K (renewed) response."""
    return _OP_U64.pack(OP_RENEW, token) + key + b"\n"


def encode_not_held(op: int, token: int, key: bytes) -> bytes:
    """Return an N (not held) response; ``op`` is ``OP_RELEASE``, ``OP_RENEW``,
    ``OP_VALIDATE`` or ``OP_WATCH``."""
    return _OP_B_U64.pack(OP_NOT_HELD, op, token) + key + b"\n"


def encode_pong(nonce: int) -> bytes:
    """Return a P (pong) response."""
    return _OP_U64.pack(OP_PING, nonce) + b"\n"


def encode_moved(op: int, ident: int, addr: bytes) -> bytes:
    """Return an M (moved) response naming the active; ``b""``: none known yet."""
    return _OP_B_U64.pack(OP_MOVED, op, ident) + addr + b"\n"


def encode_error(op: int, ident: int, code: int, msg: bytes) -> bytes:
    """Return an E (error) response.

    As Go's ``proto.AppendError``: a message over ``MAX_KEY`` bytes is cut to
    at most ``MAX_KEY`` bytes at a UTF-8 rune start, and every 0x0A in it is
    replaced by a space, so that every frame it returns parses.
    """
    if len(msg) > MAX_KEY:
        cut = MAX_KEY
        j = MAX_KEY
        while j > MAX_KEY - 4 and j > 0:
            if msg[j] & 0xC0 != 0x80:
                cut = j
                break
            j -= 1
        msg = msg[:cut]
    return _OP_B_U64_B.pack(OP_ERROR, op, ident, code) + msg.replace(b"\n", b" ") + b"\n"


def encode_welcome(nonce: int, identity: bytes) -> bytes:
    """Return an H (welcome) response naming the identity now in force."""
    return _OP_U64.pack(OP_HELLO, nonce) + identity + b"\n"


def encode_valid(token: int, remaining: int, key: bytes) -> bytes:
    """Return a V (valid) response (§9): ``remaining`` ms of lease left."""
    return _OP_U64_I.pack(OP_VALIDATE, token, remaining) + key + b"\n"


def encode_watching(token: int, key: bytes) -> bytes:
    """Return a W (watching) response (§9)."""
    return _OP_U64.pack(OP_WATCH, token) + key + b"\n"


def encode_lost(token: int, reason: int, key: bytes) -> bytes:
    """Return an L (grant ended) response (§9), pushed once per watch."""
    return _OP_U64_B.pack(OP_LOST, token, reason) + key + b"\n"


def encode_inspection(
    nonce: int, holders: int, limit: int, waiters: int, token: int, remaining: int, key: bytes
) -> bytes:
    """Return an I (inspection) response (§9)."""
    return _OP_INSPECTION.pack(OP_INSPECT, nonce, holders, limit, waiters, token, remaining) + key + b"\n"


# Parsers.


def _frame_end(buf: bytes | bytearray, tail: int, op: int, ident: int) -> int:
    """Return the index of the 0x0A that ends the frame whose tail starts at
    ``tail``, -1 if more bytes are needed; raise FrameError when more than
    MAX_KEY tail bytes are present without one."""
    nl = buf.find(b"\n", tail, tail + MAX_KEY + 1)
    if nl < 0:
        if len(buf) - tail > MAX_KEY:
            raise FrameError("tail longer than 1024 bytes without 0x0A", op, ident)
        return -1
    return nl


def parse_request(
    buf: bytes | bytearray, pos: int = 0, max_key: int = MAX_KEY
) -> tuple[int, Request, int] | None:
    """Decode the request frame that starts at ``buf[pos]``.

    Returns ``None`` when ``buf`` holds only a prefix of a possibly valid
    frame, else ``(end, request, code)``: ``end`` is the index just past the
    frame, ``code`` is 0 for a valid frame, ``CODE_BAD_KEY`` (empty, longer
    than ``max_key`` — values outside 1..1024 mean 1024 —, or not UTF-8),
    ``CODE_BAD_LEASE`` (lease 0 in A, K or S) or ``CODE_LIMIT_MISMATCH``
    (limit 0 in S), in that order of precedence; the frame is consumed whole
    either way. Raises :class:`FrameError` (code 1)
    for an unknown op, a tail over 1024 bytes without 0x0A, or a ping with a
    tail; its ``id`` is the header's id when the header was read.

    Hello tails are returned as they are: what an identity and a secret may
    be is the server's rule (§8.3), not the codec's.
    """
    if pos >= len(buf):
        return None
    op = buf[pos]
    hl = _REQ_HL[op]
    if hl == 0:
        raise FrameError(f"unknown request op 0x{op:02x}", op)
    tail = pos + 1 + hl
    if len(buf) < tail:
        return None
    wait = lease = limit = 0
    if op == OP_ACQUIRE:
        wait = buf[pos + 1]
        lease = buf[pos + 2]
        ident = _U64.unpack_from(buf, pos + 3)[0]
    elif op == OP_SHARED:
        wait = buf[pos + 1]
        lease = buf[pos + 2]
        ident, limit = _U64_H.unpack_from(buf, pos + 3)
    elif op == OP_RENEW:
        lease = buf[pos + 1]
        ident = _U64.unpack_from(buf, pos + 2)[0]
    else:
        ident = _U64.unpack_from(buf, pos + 1)[0]
    if op == OP_PING:
        if len(buf) == tail:
            return None
        if buf[tail] != 0x0A:
            raise FrameError("ping with a tail", op, ident)
        return tail + 1, Request(op, 0, 0, ident, b""), 0
    nl = _frame_end(buf, tail, op, ident)
    if nl < 0:
        return None
    key = bytes(buf[tail:nl])
    req = Request(op, wait, lease, ident, key, limit)
    if op == OP_HELLO:
        return nl + 1, req, 0
    if max_key < 1 or max_key > MAX_KEY:
        max_key = MAX_KEY
    if not key or len(key) > max_key or not _valid_utf8(key):
        return nl + 1, req, CODE_BAD_KEY
    if lease == 0 and (op == OP_ACQUIRE or op == OP_RENEW or op == OP_SHARED):
        return nl + 1, req, CODE_BAD_LEASE
    if limit == 0 and op == OP_SHARED:
        return nl + 1, req, CODE_LIMIT_MISMATCH
    return nl + 1, req, 0


def _valid_utf8(b: bytes) -> bool:
    if b.isascii():
        return True
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _scan_response(
    buf: bytes | bytearray, pos: int
) -> tuple[int, int, int, int, int, int, int, int] | None:
    """The client's response parser: ``(end, op, req_op, id, token, code,
    tail_start, tail_end)`` for the frame at ``buf[pos]``, ``None`` if
    incomplete; raises FrameError. ``token`` is the newest holder's of an
    I; the other §9 fields are read by :func:`_extra`. ``parse_response``
    is its public form."""
    op = buf[pos]
    hl = _RESP_HL[op]
    if hl == 0:
        raise FrameError(f"unknown response op 0x{op:02x}", op)
    tail = pos + 1 + hl
    if len(buf) < tail:
        return None
    req_op = token = code = 0
    if op == OP_ACQUIRE:
        ident, token = _U64U64.unpack_from(buf, pos + 1)
    elif op == OP_INSPECT:
        ident = _U64.unpack_from(buf, pos + 1)[0]
        token = _U64.unpack_from(buf, pos + 17)[0]
    elif op == OP_NOT_HELD or op == OP_MOVED:
        req_op, ident = _B_U64.unpack_from(buf, pos + 1)
    elif op == OP_ERROR:
        req_op, ident, code = _B_U64_B.unpack_from(buf, pos + 1)
    else:
        ident = _U64.unpack_from(buf, pos + 1)[0]
    if op == OP_PING:
        if len(buf) == tail:
            return None
        if buf[tail] != 0x0A:
            raise FrameError("pong with a tail", op, ident)
        return tail + 1, op, 0, ident, 0, 0, tail, tail
    nl = buf.find(b"\n", tail, tail + MAX_KEY + 1)
    if nl < 0:
        if len(buf) - tail > MAX_KEY:
            raise FrameError("tail longer than 1024 bytes without 0x0A", op, ident)
        return None
    return nl + 1, op, req_op, ident, token, code, tail, nl


def _extra(buf: bytes | bytearray, pos: int, op: int) -> tuple[int, int, int, int, int]:
    """``(reason, remaining, holders, limit, waiters)`` of the whole §9
    answer (V, L, I) that starts at ``buf[pos]``; zeros for other ops."""
    if op == OP_VALIDATE:
        return 0, _U32.unpack_from(buf, pos + 9)[0], 0, 0, 0
    if op == OP_LOST:
        return buf[pos + 9], 0, 0, 0, 0
    if op == OP_INSPECT:
        holders, limit, waiters, _token, remaining = _INSPECTION.unpack_from(buf, pos + 9)
        return 0, remaining, holders, limit, waiters
    return 0, 0, 0, 0, 0


def parse_response(buf: bytes | bytearray, pos: int = 0) -> tuple[int, Response] | None:
    """Decode the response frame that starts at ``buf[pos]``.

    Returns ``None`` when ``buf`` holds only a prefix of a possibly valid
    frame, else ``(end, response)`` with ``end`` the index just past it.
    Raises :class:`FrameError` for an unknown op, a tail over 1024 bytes
    without 0x0A, or a pong with a tail. Keys are not validated, and the op
    byte of N, M and E is returned as read, as is an L's reason.
    """
    if pos >= len(buf):
        return None
    r = _scan_response(buf, pos)
    if r is None:
        return None
    end, op, req_op, ident, token, code, ts, te = r
    return end, Response(op, req_op, ident, token, code, bytes(buf[ts:te]), *_extra(buf, pos, op))
