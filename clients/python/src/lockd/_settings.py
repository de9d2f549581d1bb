"""The client's validated options: :class:`Settings`, built by
:func:`settings` from :class:`lockd.Client`'s keyword arguments."""

from __future__ import annotations

import math
import os
import re
import ssl as _ssl
from dataclasses import dataclass, field

from . import errors
from ._types import split_addr
from .proto import MAX_SECRET, MAX_WAIT

_IDENTITY_RE = re.compile(rb"[A-Za-z0-9._@-]{1,64}\Z")

# A renewal attempt's answer is awaited at most this part of its lease (at
# least MIN_RENEW_TIMEOUT) before the renewal goes to another member:
# renewing every third of the lease, a renewal stuck on a frozen member then
# moves on with 5/12 of the lease left for the failover and the new active's
# answer, while a live active slowed down by load has a quarter of the lease
# to answer before it is passed over (its connection stays either way).
RENEW_TIMEOUT_SHARE = 1 / 4
MIN_RENEW_TIMEOUT = 0.25


@dataclass(frozen=True, slots=True)
class Settings:
    """Every option of a client, checked (see :class:`lockd.Client`)."""

    addrs: tuple[str, ...]
    ssl: _ssl.SSLContext | None
    server_hostname: str | None
    identity: str | None
    hello: bytes | None = field(repr=False)  # the H frame's tail (it holds the secret); None: no hello
    conns_per_addr: int
    dial_timeout: float
    reconnect_interval: float
    transport_timeout: float
    answer_allowance: float
    release_retry: float
    release_retry_interval: float
    retry_pause: float
    default_lease: float
    fail_fast: bool
    watch_locks: bool = True  # watch every held lock (PROTOCOL.md §9.4)

    def renew_timeout(self, lease: int) -> float:
        """How long one renewal attempt of a ``lease``-second lease waits for
        its answer before the renewal goes to another member: it scales with
        the lease, so that a renewal sent to a member that froze is tried on
        another early enough to land before the lease ends."""
        return min(self.transport_timeout, max(MIN_RENEW_TIMEOUT, lease * RENEW_TIMEOUT_SHARE))


def settings(
    addrs: list[str] | tuple[str, ...],
    *,
    ssl: _ssl.SSLContext | None,
    server_hostname: str | None,
    identity: str | None,
    secret: str | bytes | None,
    secret_file: str | os.PathLike[str] | None,
    conns_per_addr: int,
    dial_timeout: float,
    reconnect_interval: float,
    transport_timeout: float,
    answer_allowance: float,
    release_retry: float,
    release_retry_interval: float,
    retry_pause: float,
    default_lease: float,
    fail_fast: bool,
    watch_locks: bool = True,
) -> Settings:
    """Check the options; raise :class:`lockd.InvalidArgument`."""
    if isinstance(addrs, str):
        raise errors.InvalidArgument("lockd: addrs must be a list of host:port strings, not one string")
    if not addrs:
        raise errors.InvalidArgument("lockd: no server addresses")
    for a in addrs:
        split_addr(a)
    if not 0 <= conns_per_addr <= 64:
        raise errors.InvalidArgument("lockd: conns_per_addr must be 0..64")
    if conns_per_addr == 0:
        conns_per_addr = 2 if len(addrs) == 1 else 1
    for name, v in (
        ("dial_timeout", dial_timeout),
        ("reconnect_interval", reconnect_interval),
        ("transport_timeout", transport_timeout),
        ("answer_allowance", answer_allowance),
        ("release_retry", release_retry),
        ("release_retry_interval", release_retry_interval),
        ("retry_pause", retry_pause),
        ("default_lease", default_lease),
    ):
        if not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
            raise errors.InvalidArgument(f"lockd: {name} must be a positive number of seconds")
    if default_lease > MAX_WAIT:
        raise errors.InvalidLease("lockd: default_lease must be at most 255 s")
    if ssl is not None and not isinstance(ssl, _ssl.SSLContext):
        raise errors.InvalidArgument("lockd: ssl must be an ssl.SSLContext")
    if server_hostname is not None and ssl is None:
        raise errors.InvalidArgument("lockd: server_hostname needs ssl")
    return Settings(
        addrs=tuple(addrs),
        ssl=ssl,
        server_hostname=server_hostname,
        identity=identity,
        hello=_hello(identity, secret, secret_file),
        conns_per_addr=conns_per_addr,
        dial_timeout=float(dial_timeout),
        reconnect_interval=float(reconnect_interval),
        transport_timeout=float(transport_timeout),
        answer_allowance=float(answer_allowance),
        release_retry=float(release_retry),
        release_retry_interval=float(release_retry_interval),
        retry_pause=float(retry_pause),
        default_lease=float(default_lease),
        fail_fast=bool(fail_fast),
        watch_locks=bool(watch_locks),
    )


def _hello(identity: str | None, secret: str | bytes | None, secret_file: str | os.PathLike[str] | None) -> bytes | None:
    """The H frame's tail, or None when no hello is sent."""
    if secret is not None and secret_file is not None:
        raise errors.InvalidArgument("lockd: give secret or secret_file, not both")
    if secret_file is not None:
        with open(secret_file, "rb") as f:
            secret = f.read()
        if secret.endswith(b"\r\n"):
            secret = secret[:-2]
        elif secret.endswith(b"\n"):
            secret = secret[:-1]
    if identity is None:
        if secret is not None:
            raise errors.InvalidArgument("lockd: a secret without an identity")
        return None
    ib = identity.encode("utf-8", "replace")
    if not _IDENTITY_RE.match(ib):
        raise errors.InvalidArgument("lockd: identity must be 1..64 characters of A-Z a-z 0-9 . _ @ -")
    if secret is None:
        return None  # authenticated by the client certificate: no H
    sb = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not sb or len(sb) > MAX_SECRET or b"\n" in sb:
        raise errors.InvalidArgument("lockd: the secret must be 1..256 bytes without a newline")
    return ib + b" " + sb
