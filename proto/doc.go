// Package proto is the frame codec of the lockd wire protocol, version 1:
// the framing, requests and responses of PROTOCOL.md §1–3, the hello of
// §8.3 and the ops of §9 (acquire shared, validate, watch, inspect and the
// pushed L), byte for byte.
//
// Every frame, in both directions, is
//
//	op (1 byte) | fixed header (binary, length set by op) | tail | 0x0A
//
// with unsigned big-endian integers. The fixed header may itself contain
// 0x0A, so the parsers consume 1+header bytes by count and only then look
// for the terminating 0x0A in the tail. No tail is longer than [MaxKey].
//
// # What it owns
//
// [ParseRequest] and [ParseResponse] decode the first frame of a buffer into
// a caller-owned [Request] or [Response] whose byte fields point into that
// buffer; they report a short buffer as [ErrIncomplete] and rejected frames as
// the sentinel errors [ErrBadFrame], [ErrBadKey], [ErrBadLease] and
// [ErrBadLimit] (an acquire shared with limit 0), which [Code] maps to the
// error codes of an E frame. What the parser cannot know — a limit other
// than the key's holders' (E 7), a watch beyond the connection's bound
// (E 8) — the server decides from its state (PROTOCOL.md §9.6 orders the
// checks). The AppendX functions ([AppendAcquire] … [AppendError],
// [AppendShared] … [AppendInspection]) append one whole frame to a byte
// slice.
//
// The §9 answers parse into the same [Response]: V carries the token in ID
// and Remaining (ms); W the token in ID; L the token in ID and Reason
// ([ReasonReleased] … [ReasonCannotTell]); I the nonce in ID and Holders,
// Limit, Waiters, Token (the newest holder's) and Remaining.
// A frame split across reads is the caller's business: keep the unparsed
// bytes, append the next read, and call the parser again from the start of
// the frame.
//
// # Concurrency
//
// The package has no state: every function is pure, works only on its
// arguments and may be called from any number of goroutines at once. A
// Request or Response must not be shared while a parser writes into it, and
// its Key or Tail is valid only as long as the parsed buffer is left
// unchanged. Parsers and encoders never allocate (an encoder only grows dst
// when its capacity is too small).
//
// # What it must not import
//
// proto may import only the standard library. It must not import net, os,
// syscall, io/fs, time, sync, runtime, unsafe or fmt: nothing that does
// I/O, keeps time or state, or formats; proto knows nothing of locks,
// tokens' meaning, sockets, gnet or the shard (internal/layers enforces
// both).
package proto
