"""lockd: the Python client of the lockd lock server (standard library only).

Take a named lock with a bounded wait and a lease, get its fencing token, keep
the lease alive while you work, release it::

    import lockd

    async with lockd.Client(["127.0.0.1:7070"]) as c:
        async with c.lock("orders/42", wait=5, lease=30) as lock:
            await store.write(order, token=lock.token)

or, without an event loop, :class:`SyncClient` with ``with c.lock(...)``.
Beyond one holder (PROTOCOL.md §9): ``c.semaphore(key, n)`` and
``c.rw_lock(key).read()`` / ``.write()`` hold counted and shared locks the
same way; ``c.validate``, ``c.watch`` and ``c.inspect`` check a token, wait
for a grant's end, and show who holds a key. :class:`Client` documents how
each rule of the protocol's client obligations (PROTOCOL.md §7, §8.6, §9)
is kept; :mod:`lockd.errors` the exceptions; :mod:`lockd.fence` the
resource side of fencing; :mod:`lockd.proto` the wire codec.

The client logs to the ``"lockd"`` logger of :mod:`logging` (connections
lost or refused, failed renewals and lost locks at WARNING; a new active
member followed and compensating releases at INFO). The package adds only a
:class:`logging.NullHandler`, as a library should: configure logging
(``logging.basicConfig()``) to see it.
"""

import logging as _logging

from . import errors, fence, proto
from .client import (
    MAX_REDIRECT_ADDRS,
    READERS,
    Client,
    Grant,
    HeldLock,
    Inspection,
    Lock,
    LockContext,
    RWLock,
    Semaphore,
    Watch,
    tls_context,
)
from .errors import (
    Busy,
    Closed,
    ClosedIndeterminate,
    GrantEnded,
    Indeterminate,
    InvalidArgument,
    InvalidKey,
    InvalidLease,
    InvalidWait,
    LimitMismatch,
    LockdError,
    LockLost,
    NoConnection,
    NotHeld,
    PermissionDenied,
    Reason,
    Rejected,
    ServerError,
    Timeout,
    Unauthenticated,
    Unsupported,
    WatchLimit,
)
from .sync import SyncClient, SyncHeldLock, SyncLockContext, SyncRWLock, SyncSemaphore, SyncWatch

_logging.getLogger("lockd").addHandler(_logging.NullHandler())

__version__ = "0.1.0"
"""The package's version."""

__all__ = [
    "Client",
    "SyncClient",
    "Lock",
    "HeldLock",
    "SyncHeldLock",
    "LockContext",
    "SyncLockContext",
    "Watch",
    "SyncWatch",
    "Reason",
    "Inspection",
    "Semaphore",
    "SyncSemaphore",
    "RWLock",
    "SyncRWLock",
    "Grant",
    "READERS",
    "MAX_REDIRECT_ADDRS",
    "tls_context",
    "errors",
    "fence",
    "proto",
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
