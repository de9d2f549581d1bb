package client

import (
	"errors"
	"strconv"

	"github.com/lockd-dev/lockd/proto"
)

// Errors returned by the client. Test them with errors.Is. Apart from
// ErrIndeterminate (and errors that match it), every error returned by
// Acquire means that no lock was granted to the caller.
var (
	// ErrTimeout is a definitive "not granted" while lockd was reachable:
	// the server answered T (the wait ended with the key still held), or
	// the caller's wait ran out first — with the request not yet sent, not
	// executed (M without an address, E 4), or sent and not yet answered
	// (a grant that comes later is released at once). A wait that ran out
	// with no connection is ErrNoConnection, never ErrTimeout: an outage
	// is not a busy lock. (Ping uses ErrTimeout for a pong that did not
	// come back in time.)
	ErrTimeout = errors.New("client: timed out, not acquired")
	// ErrBusy is a definitive "not granted": the server answered B (its
	// queue or key capacity is full); nothing was queued.
	ErrBusy = errors.New("client: server busy, not acquired")
	// ErrIndeterminate means the request may or may not have been executed:
	// a byte of it may have reached the server and its connection was lost
	// before the answer, or a transport deadline passed (a wait-0 acquire,
	// a release or renew out of retries). A caller's wait that ran out, or a
	// cancelled ctx, is not indeterminate (ErrTimeout, ctx's error). The
	// caller must not enter the critical section. An unobserved grant ends
	// at the latest when its lease does.
	ErrIndeterminate = errors.New("client: outcome indeterminate, do not assume the lock is held")
	// ErrNotHeld is the server's N: the token is not the key's current
	// grant (released, or the lease ended).
	ErrNotHeld = errors.New("client: lock not held")
	// ErrNoConnection means no connection to any server was available
	// before the call's deadline (or, with Config.FailFast, none could be
	// made at all); nothing was sent. The error returned carries the
	// reason when one is known — the last dial error, or ErrRejected —
	// in its message and through errors.Unwrap.
	ErrNoConnection = errors.New("client: no connection to lockd")
	// ErrRejected is the reason given with ErrNoConnection when a server
	// accepted a connection and closed it at once (within a second of the
	// dial) without sending a byte: what lockd does at its connection limit
	// (--max-conns) or while shutting down. Requests sent on such a
	// connection count as not executed, and go to another connection.
	ErrRejected = errors.New("client: lockd accepted the connection and closed it at once without a frame")
	// ErrTLS is the reason given with ErrNoConnection when TLS failed: a
	// handshake that failed (an unknown CA, a wrong server name, a server
	// without TLS), a client certificate the server refused or required,
	// or a plaintext client on a TLS port (lockd's E 1 says so). The
	// error returned names the failure.
	ErrTLS = errors.New("client: TLS failure")
	// ErrClosed means the Client was closed. A pending acquire that may
	// already have been sent when Close ran fails with an error matching
	// both ErrClosed and ErrIndeterminate.
	ErrClosed = errors.New("client: closed")
	// ErrLockLost is the cause WithLock gives to fn's context when the lock
	// could no longer be shown to be held (renew answered N, or renewals
	// kept failing until the lease's conservative end), and what WithLock
	// then returns, whatever fn returned.
	ErrLockLost = errors.New("client: lock lost")
	// ErrUnauthenticated is the server's E 5 (PROTOCOL.md §8.3): its
	// --acl refused the hello (unknown identity, wrong secret), or the
	// request came on a connection without an identity. It is definitive:
	// the request was not executed, and it is not retried on another
	// connection, where the same credentials fail the same way. The error
	// returned names the cause (the identity and the server), never the
	// secret. The server closes the connection: every request pipelined
	// behind a refused hello fails with it too, not executed (the hello
	// is each connection's first frame, and the server judges what
	// follows by it). Until a hello succeeds again, a call that finds no
	// live connection fails with it at once.
	ErrUnauthenticated = errors.New("client: unauthenticated")
	// ErrPermissionDenied is the server's E 6 (PROTOCOL.md §8.3): the
	// identity may not lock that key (outside its prefixes, or a monitor
	// identity). Definitive, not executed, not retried; the connection
	// stays open.
	ErrPermissionDenied = errors.New("client: permission denied")
	// ErrInvalidKey rejects a key that is empty, longer than 1024 bytes,
	// not valid UTF-8 or containing 0x0A; nothing is sent.
	ErrInvalidKey = errors.New("client: invalid key")
	// ErrInvalidWait rejects a negative wait or one above 255 s.
	ErrInvalidWait = errors.New("client: wait must be 0..255s")
	// ErrInvalidLease rejects a negative lease or one above 255 s.
	ErrInvalidLease = errors.New("client: lease must be 1..255s")
	// ErrInvalidLimit rejects the limit of a shared acquire outside
	// 1..65535 (a Semaphore's permits included); nothing is sent.
	ErrInvalidLimit = errors.New("client: limit must be 1..65535")

	// ErrUnsupported means the server does not speak PROTOCOL.md §9: it
	// answered an acquire shared, validate, watch or inspect with E 1
	// and closed the connection, as a lockd older than §9 does. The
	// request was not executed. The error returned names the server;
	// until that server's connection ends for another reason (a
	// restart, perhaps an upgrade), the client sends it no §9 request
	// again and fails them at once with this error.
	ErrUnsupported = errors.New("client: lockd does not support this request (PROTOCOL.md §9: shared locks, validate, watch, inspect)")
	// ErrLimitMismatch is the server's E 7: a shared acquire whose limit
	// differs from the limit of the key's current holders. Not executed,
	// definitive; the connection stays open. Test with errors.Is (the
	// error returned is a *ServerError with its message).
	ErrLimitMismatch = errors.New("client: the key is held with another limit")
	// ErrWatchLimit is the server's E 8: a watch beyond the connection's
	// bound (--max-watches-per-conn). Not executed; the connection stays
	// open. The client sends a watch to a connection that has not refused
	// one since its last watch ended, and returns ErrWatchLimit when
	// every connection has (a KeepAlive then tries again every renewal
	// interval, its renewals guarding the lock meanwhile).
	ErrWatchLimit = errors.New("client: too many watches on the connection")
	// ErrWatchStopped is a Watch's Err after its Stop.
	ErrWatchStopped = errors.New("client: watch stopped")
)

// ServerError is an E answer other than "shutting down" (code 4, which the
// client handles itself by sending again: a release or renew that is
// still answered E 4 when its retries end returns it), "unauthenticated"
// (5: ErrUnauthenticated) and "permission denied" (6:
// ErrPermissionDenied): the server rejected the request and did not
// execute it.
type ServerError struct {
	Op   proto.Op // the request's op
	Code uint8    // proto.CodeBadFrame, CodeBadKey, CodeBadLease, ...
	Msg  string   // the server's message
}

// Error implements error.
func (e *ServerError) Error() string {
	return "client: server rejected " + e.Op.String() + " (code " + strconv.Itoa(int(e.Code)) + "): " + e.Msg
}

// Is matches the sentinel of the codes that have one: ErrLimitMismatch
// for E 7, ErrWatchLimit for E 8.
func (e *ServerError) Is(target error) bool {
	switch e.Code {
	case proto.CodeLimitMismatch:
		return target == ErrLimitMismatch
	case proto.CodeLimitReached:
		return target == ErrWatchLimit
	}
	return false
}

// unsupportedError is ErrUnsupported from one server: its E 1 to a §9
// request. seq is the send sequence of the request it refused, the first
// §9 request the connection carried that had no answer yet (an E 1 of a
// server that does not know the op cannot carry its id).
type unsupportedError struct {
	addr string
	op   proto.Op
	msg  string
	seq  uint64
}

func (e *unsupportedError) Error() string {
	return "client: lockd at " + e.addr + " does not support " + e.op.String() +
		" (PROTOCOL.md §9: shared locks, validate, watch, inspect): it answered E 1 (" + e.msg +
		") and closed the connection; upgrade it"
}

func (e *unsupportedError) Is(target error) bool { return target == ErrUnsupported }

// closedBy9Error is ErrIndeterminate for an acquire sent on a connection
// before a §9 request that the server refused (E 1) by closing it: the
// server read the acquire, and may have granted it.
type closedBy9Error struct{ refusal *unsupportedError }

func (e *closedBy9Error) Error() string {
	return ErrIndeterminate.Error() + ": lockd at " + e.refusal.addr + " closed the connection on refusing a later " +
		e.refusal.op.String() + " it does not support (PROTOCOL.md §9), after it had read this request"
}

func (e *closedBy9Error) Is(target error) bool { return target == ErrIndeterminate }

// bothErr is an error that matches two sentinels, for outcomes that are
// both (errors.Is sees either).
type bothErr struct {
	msg  string
	a, b error
}

func (e *bothErr) Error() string { return e.msg }

func (e *bothErr) Is(target error) bool { return target == e.a || target == e.b }

var (
	// errClosedIndeterminate: a call that may have been executed when the
	// client was closed.
	errClosedIndeterminate error = &bothErr{"client: closed with the request possibly sent (outcome indeterminate)", ErrClosed, ErrIndeterminate}
)

// noConnError is ErrNoConnection with the reason of the last failure.
type noConnError struct{ cause error }

func (e *noConnError) Error() string { return ErrNoConnection.Error() + ": " + e.cause.Error() }

func (e *noConnError) Is(target error) bool { return target == ErrNoConnection }

func (e *noConnError) Unwrap() error { return e.cause }

// rejectedError is ErrRejected at one address.
type rejectedError struct {
	addr  string
	plain bool // the client does not speak TLS
}

func (e *rejectedError) Error() string {
	msg := "lockd at " + e.addr + " accepted the connection and closed it at once without a frame: it may be at its connection limit (--max-conns) or shutting down"
	if e.plain {
		// lockd's TLS port says so (refusedError); another TLS server,
		// in front of lockd, may close in silence.
		msg += ", or a TLS port that this client, without TLS, reached"
	}
	return msg
}

func (e *rejectedError) Is(target error) bool { return target == ErrRejected }

// addrError is why the connection to addr ended.
type addrError struct {
	addr string
	err  error
}

func (e *addrError) Error() string { return "connection to " + e.addr + " lost: " + e.err.Error() }

func (e *addrError) Unwrap() error { return e.err }

// Internal causes for closing a connection.
var (
	errAbandoned = errors.New("client: request abandoned with its answer outstanding")
	errOverdue   = errors.New("client: no answer to an acquire by the end of its wait and Config.AnswerAllowance")
	errRetired   = errors.New("client: connection to an address no M has named lately, closed once idle")
	errBadAnswer = errors.New("client: server sent a bad frame")
	errServerE1  = errors.New("client: server reported a bad frame (E 1)")
)
