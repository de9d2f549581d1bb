"""The exceptions of the lockd client: one base class, :class:`LockdError`.

They mirror the errors of the Go client (``client/errors.go``). Apart from
:class:`Indeterminate` (and its subclasses), every exception raised by an
acquire means that nothing was granted to the caller.

==========================  ==================================================
exception                   meaning
==========================  ==================================================
:class:`Timeout`            the caller's wait ran out with lockd reachable
                            (``T``, or no answer by the deadline): not granted;
                            also a :class:`TimeoutError`
:class:`Busy`               lockd answered ``B``: its queue or capacity is full
:class:`NoConnection`       no server could be reached before the deadline
                            (or every one refused the connection before reading
                            a request); nothing executed. ``cause`` says why
:class:`Indeterminate`      the request may or may not have executed: do not
                            assume the lock is held (its lease frees it)
:class:`NotHeld`            ``N``: the token is not the key's current grant
:class:`GrantEnded`         a :class:`NotHeld` told by lockd's ``L``: the
                            watched grant ended, ``reason`` says how (§9.4)
:class:`LockLost`           a held lock could no longer be shown to be held
:class:`Unauthenticated`    ``E`` 5: the server refused the identity (§8)
:class:`PermissionDenied`   ``E`` 6: the identity may not use that key (§8)
:class:`LimitMismatch`      ``E`` 7: the key's holders have another limit (§9)
:class:`WatchLimit`         ``E`` 8, or no connection with room for a watch
:class:`Unsupported`        the server does not speak §9 (it answered ``E`` 1)
:class:`ServerError`        another ``E``: rejected, not executed
:class:`Closed`             the client was closed
:class:`InvalidArgument`    bad key, wait, lease or option; nothing was sent
==========================  ==================================================
"""

from __future__ import annotations

import enum

__all__ = [
    "Reason",
    "LockdError",
    "Timeout",
    "Busy",
    "NoConnection",
    "Rejected",
    "Indeterminate",
    "NotHeld",
    "GrantEnded",
    "LockLost",
    "Closed",
    "ClosedIndeterminate",
    "Unauthenticated",
    "PermissionDenied",
    "LimitMismatch",
    "WatchLimit",
    "Unsupported",
    "ServerError",
    "InvalidArgument",
    "InvalidKey",
    "InvalidWait",
    "InvalidLease",
]


class Reason(enum.IntEnum):
    """Why a watched grant ended: the reason of lockd's ``L`` (PROTOCOL.md
    §9.4). (The protocol's fourth, "this member can no longer tell", is no
    end: the client watches again where the grant is served now.)"""

    RELEASED = 1
    """Released, by any connection (the holder's own release included)."""
    EXPIRED = 2
    """Its lease ended without a renewal."""
    FORCED = 3
    """Released by an operator: an ``admin`` identity, or the admin
    endpoint's ``DELETE /keys/{key}`` (or its lease, set by an admin's
    renew, ended)."""

    def describe(self) -> str:
        """The reason in words, for messages."""
        return _REASON_WORDS[self]


_REASON_WORDS = {
    Reason.RELEASED: "it was released",
    Reason.EXPIRED: "its lease expired",
    Reason.FORCED: "an operator released it (forced)",
}


class LockdError(Exception):
    """The base class of every exception the lockd client raises."""


class Timeout(LockdError, TimeoutError):
    """A definitive "not granted" while lockd was reachable; also a
    :class:`TimeoutError`.

    The caller's wait ran out: the server answered ``T``, or had not answered
    when the caller's deadline passed (a grant that arrives for that request
    later is released at once by the client, so nothing is left held), or
    the request could not be executed in time (``M`` without an address,
    ``E`` 4). A wait that ran out with no connection is
    :class:`NoConnection`, never :class:`Timeout`: an outage is not a busy
    lock. (``ping`` raises it for a pong that did not come back in time.)
    """


class Busy(LockdError):
    """A definitive "not granted": the server answered ``B`` (its queue or key
    capacity is full); nothing was queued."""


class NoConnection(LockdError):
    """No connection to any server was available before the call's deadline
    (or, with ``fail_fast``, none could be made at all; or every server
    refused the client's TLS); nothing was executed.

    ``cause`` (also ``__cause__``) is the reason when one is known: the last
    dial error, :class:`Rejected` (the server closed the connection before
    reading a request), the :class:`ssl.SSLError` of a refused handshake (a
    missing or unknown client certificate, an unverifiable server), or why
    the last connection ended. A request written on a connection that the
    server refused this way was not executed, so the call goes on with
    another connection, if one comes up within its deadline.
    """

    def __init__(self, msg: str = "lockd: no connection to lockd", cause: BaseException | None = None) -> None:
        if cause is not None:
            msg = f"{msg}: {cause}"
        super().__init__(msg)
        self.cause = cause
        self.__cause__ = cause


class Rejected(LockdError):
    """The reason given with :class:`NoConnection` when a server refused a
    connection before executing anything sent on it: it closed the
    connection before answering the client's first frame (which lockd
    answers at once) — what lockd does at its connection limit
    (``--max-conns``), and what an older lockd's TLS port does to a
    plaintext client — or its only answer was an ``E`` 1 saying the port
    speaks TLS. ``addr`` is the server's address; ``reason`` the server's
    own words, if it gave any."""

    def __init__(self, addr: str, reason: str = "") -> None:
        if reason:
            msg = f"lockd at {addr} refused the connection: {reason}"
        else:
            msg = (
                f"lockd at {addr} accepted the connection and closed it without answering anything: "
                "it may be at its connection limit (--max-conns), or its port speaks TLS"
            )
        super().__init__(msg)
        self.addr = addr
        self.reason = reason


class Indeterminate(LockdError):
    """The request may or may not have been executed.

    A byte of it may have reached the server and no answer was read in time
    (connection lost, deadline passed), or a grant reached the caller's
    delivery gate too late and was released again. The caller must not enter
    the critical section; an unobserved grant ends at the latest with its
    lease.
    """


class NotHeld(LockdError):
    """The server's ``N``: the token is not the key's current grant (released,
    or the lease ended)."""


class GrantEnded(NotHeld):
    """lockd told the client, with ``L`` (PROTOCOL.md §9.4), that a watched
    grant ended: ``reason`` (a :class:`Reason`) says how. ``key`` and
    ``token`` name the grant."""

    def __init__(self, key: str, token: int, reason: Reason) -> None:
        super().__init__(f"lockd: the grant of {key!r} (token {token}) ended: {reason.describe()}")
        self.key = key
        self.token = token
        self.reason = reason


class LockLost(LockdError):
    """A held lock could no longer be shown to be held.

    lockd pushed ``L`` for the lock's watch: it was released, its lease
    ended, or an operator released it (``reason`` is a :class:`GrantEnded`,
    whose ``reason`` — also :attr:`ended` here — says which); a renewal, a
    watch, or the release at the end of a ``lock()`` block was answered ``N``
    (``reason`` is a :class:`NotHeld`); the client was closed (``reason`` is
    a :class:`Closed`); or no renewal succeeded before the holder's stop time
    (``reason`` is ``None``; ``__cause__`` is the last renewal's error, if
    one failed). Work under the lock must stop.
    """

    def __init__(self, msg: str, reason: BaseException | None = None, last_error: BaseException | None = None) -> None:
        super().__init__(msg)
        self.reason = reason
        cause = reason if reason is not None else last_error
        if cause is not None:
            self.__cause__ = cause

    @property
    def ended(self) -> Reason | None:
        """How lockd said the grant ended (``L``): :attr:`Reason.RELEASED`,
        :attr:`Reason.EXPIRED` or :attr:`Reason.FORCED`; None when the loss
        was found otherwise."""
        r = self.reason
        return r.reason if isinstance(r, GrantEnded) else None


class Closed(LockdError):
    """The client was closed."""


class ClosedIndeterminate(Closed, Indeterminate):
    """The client was closed while a request that may have been executed (an
    acquire, release or renew possibly sent) was pending: both
    :class:`Closed` and :class:`Indeterminate`."""


class Unauthenticated(LockdError):
    """``E`` code 5 (§8.3): the server refused the hello (unknown identity,
    wrong secret) or requires one; it closed the connection and executed
    nothing sent on it after the hello. Definitive: the client does not retry
    it on another connection. ``message`` is the server's text."""

    def __init__(self, msg: str, message: str = "") -> None:
        super().__init__(msg)
        self.message = message


class PermissionDenied(LockdError):
    """``E`` code 6 (§8.3): the identity may not act on ``key`` (outside its
    prefixes, or a monitor identity); definitive, not executed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"lockd: permission denied for key {key!r}: {message}")
        self.key = key
        self.message = message


class LimitMismatch(LockdError):
    """``E`` code 7 (§9.2): an acquire shared whose limit differs from the
    limit of the key's current holders; definitive, not executed (nothing
    was queued). Every user of a semaphore or read/write lock must give the
    same limit. ``message`` is the server's text."""

    def __init__(self, key: str, limit: int, message: str) -> None:
        super().__init__(f"lockd: limit {limit} for {key!r} refused: {message}")
        self.key = key
        self.limit = limit
        self.message = message


class WatchLimit(LockdError):
    """``E`` code 8 (§9.4): every connection to the member refused another
    watch (each holds the server's bound of watches,
    ``--max-watches-per-conn``, and none of them has ended since);
    definitive, not executed. ``message`` is the server's text, or the
    client's when it knew without asking."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"lockd: cannot watch {key!r}: {message}")
        self.key = key
        self.message = message


class Unsupported(LockdError):
    """The server at ``addr`` does not support ``op`` (a request of
    PROTOCOL.md §9: acquire shared, validate, watch, inspect): it answered
    ``E`` 1 and closed the connection, as a lockd older than §9 does. Not
    executed; upgrade the server. The requests that were on the same
    connection say so too. ``message`` is the server's text."""

    def __init__(self, addr: str, op: str, message: str) -> None:
        super().__init__(
            f"lockd at {addr} does not support {op} (PROTOCOL.md §9; it answered E 1: {message}): "
            "upgrade the server"
        )
        self.addr = addr
        self.op = op
        self.message = message


class ServerError(LockdError):
    """An ``E`` answer the client does not handle itself: the server rejected
    the request and did not execute it. ``op`` is the request's op letter,
    ``code`` the error code, ``message`` the server's text."""

    def __init__(self, op: str, code: int, message: str) -> None:
        super().__init__(f"lockd: server rejected {op} (code {code}): {message}")
        self.op = op
        self.code = code
        self.message = message


class InvalidArgument(LockdError, ValueError):
    """A bad argument or option; nothing was sent."""


class InvalidKey(InvalidArgument):
    """A key that is empty, longer than 1024 bytes in UTF-8, not encodable as
    UTF-8, or containing a newline."""


class InvalidWait(InvalidArgument):
    """A wait outside 0..255 seconds (there is no infinite wait: loop)."""


class InvalidLease(InvalidArgument):
    """A lease outside (0, 255] seconds."""
