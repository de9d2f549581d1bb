package proto

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

type reqCase struct {
	name   string
	in     string
	maxKey int // passed as is: 0 and out-of-range values mean MaxKey
	n      int
	err    error
	want   Request // compared unless err is ErrIncomplete
}

var (
	k16   = "0123456789abcdef"
	k1024 = strings.Repeat("k", MaxKey)
	k1025 = strings.Repeat("k", MaxKey+1)
)

func reqCases() []reqCase {
	acq := func(wait, lease byte, owner uint64, key string) Request {
		return Request{Op: OpAcquire, Wait: wait, Lease: lease, ID: owner, Key: []byte(key)}
	}
	long := func(op string, hdr string) string { return op + hdr + k1025 }
	shr := func(wait, lease byte, owner uint64, limit uint16, key string) Request {
		return Request{Op: OpShared, Wait: wait, Lease: lease, ID: owner, Limit: limit, Key: []byte(key)}
	}
	return []reqCase{
		// acquire
		{name: "acquire", in: rawAcquire(5, 30, 7, "lock/a"), want: acq(5, 30, 7, "lock/a")},
		{name: "acquire/wait0", in: rawAcquire(0, 1, 1, "k"), want: acq(0, 1, 1, "k")},
		{name: "acquire/wait255-lease255", in: rawAcquire(255, 255, 1<<63, "k"), want: acq(255, 255, 1<<63, "k")},
		{name: "acquire/owner0", in: rawAcquire(1, 1, 0, "k"), want: acq(1, 1, 0, "k")},
		{name: "acquire/newlines-in-header", in: rawAcquire('\n', '\n', nl8, "k"), want: acq('\n', '\n', nl8, "k")},
		{name: "acquire/key1024", in: rawAcquire(1, 1, 2, k1024), want: acq(1, 1, 2, k1024)},
		{name: "acquire/key-control-bytes", in: rawAcquire(1, 1, 2, "a\x00b\x01\x1f\x7f\r\t"), want: acq(1, 1, 2, "a\x00b\x01\x1f\x7f\r\t")},
		{name: "acquire/key-multibyte", in: rawAcquire(1, 1, 2, "ключ/🔒/€"), want: acq(1, 1, 2, "ключ/🔒/€")},
		{name: "acquire/key-nul-only", in: rawAcquire(1, 1, 2, "\x00"), want: acq(1, 1, 2, "\x00")},
		{name: "acquire/maxKey-equal", in: rawAcquire(1, 1, 2, k16), maxKey: 16, want: acq(1, 1, 2, k16)},
		{name: "acquire/maxKey0-means-1024", in: rawAcquire(1, 1, 2, k1024), maxKey: 0, want: acq(1, 1, 2, k1024)},
		{name: "acquire/maxKey-negative-means-1024", in: rawAcquire(1, 1, 2, k1024), maxKey: -5, want: acq(1, 1, 2, k1024)},
		{name: "acquire/lease0", in: rawAcquire(3, 0, 9, "k"), err: ErrBadLease, want: acq(3, 0, 9, "k")},
		{name: "acquire/empty-key", in: rawAcquire(3, 4, 9, ""), err: ErrBadKey, want: acq(3, 4, 9, "")},
		{name: "acquire/empty-key-lease0", in: rawAcquire(3, 0, 9, ""), err: ErrBadKey, want: acq(3, 0, 9, "")},
		{name: "acquire/invalid-utf8", in: rawAcquire(3, 4, 9, "a\xffb"), err: ErrBadKey, want: acq(3, 4, 9, "a\xffb")},
		{name: "acquire/truncated-rune", in: rawAcquire(3, 4, 9, "\xe2\x82"), err: ErrBadKey, want: acq(3, 4, 9, "\xe2\x82")},
		{name: "acquire/surrogate", in: rawAcquire(3, 4, 9, "\xed\xa0\x80"), err: ErrBadKey, want: acq(3, 4, 9, "\xed\xa0\x80")},
		{name: "acquire/invalid-utf8-lease0", in: rawAcquire(3, 0, 9, "\xff"), err: ErrBadKey, want: acq(3, 0, 9, "\xff")},
		{name: "acquire/over-maxKey", in: rawAcquire(3, 4, 9, k16+"x"), maxKey: 16, err: ErrBadKey, want: acq(3, 4, 9, k16+"x")},
		{name: "acquire/over-maxKey1", in: rawAcquire(3, 4, 9, "xy"), maxKey: 1, err: ErrBadKey, want: acq(3, 4, 9, "xy")},
		{name: "acquire/key1024-over-maxKey", in: rawAcquire(3, 4, 9, k1024), maxKey: 1023, err: ErrBadKey, want: acq(3, 4, 9, k1024)},
		{name: "acquire/key1025-with-newline", in: rawAcquire(3, 4, 9, k1025), n: 1 + 10 + 1025, err: ErrBadFrame, want: Request{Op: OpAcquire, Wait: 3, Lease: 4, ID: 9}},
		{name: "acquire/key1025-no-newline", in: long("A", "\x03\x04"+be64(9)), n: 1 + 10 + 1025, err: ErrBadFrame, want: Request{Op: OpAcquire, Wait: 3, Lease: 4, ID: 9}},
		{name: "acquire/key1025-maxKey2000", in: long("A", "\x03\x04"+be64(9)), maxKey: 2000, n: 1 + 10 + 1025, err: ErrBadFrame, want: Request{Op: OpAcquire, Wait: 3, Lease: 4, ID: 9}},
		{name: "acquire/key1025-lease0", in: rawAcquire(3, 0, 9, k1025), n: 1 + 10 + 1025, err: ErrBadFrame, want: Request{Op: OpAcquire, Wait: 3, ID: 9}},
		{name: "acquire/followed-by-more", in: rawAcquire(1, 2, 3, "a") + rawPing(4), n: len(rawAcquire(1, 2, 3, "a")), want: acq(1, 2, 3, "a")},

		// release
		{name: "release", in: rawRelease(1234, "lock/a"), want: Request{Op: OpRelease, ID: 1234, Key: []byte("lock/a")}},
		{name: "release/token0", in: rawRelease(0, "k"), want: Request{Op: OpRelease, Key: []byte("k")}},
		{name: "release/newlines-in-header", in: rawRelease(nl8, "k"), want: Request{Op: OpRelease, ID: nl8, Key: []byte("k")}},
		{name: "release/key1024", in: rawRelease(5, k1024), want: Request{Op: OpRelease, ID: 5, Key: []byte(k1024)}},
		{name: "release/empty-key", in: rawRelease(5, ""), err: ErrBadKey, want: Request{Op: OpRelease, ID: 5, Key: []byte("")}},
		{name: "release/invalid-utf8", in: rawRelease(5, "\xc0\xaf"), err: ErrBadKey, want: Request{Op: OpRelease, ID: 5, Key: []byte("\xc0\xaf")}},
		{name: "release/over-maxKey", in: rawRelease(5, "abc"), maxKey: 2, err: ErrBadKey, want: Request{Op: OpRelease, ID: 5, Key: []byte("abc")}},
		{name: "release/key1025", in: rawRelease(5, k1025), n: 1 + 8 + 1025, err: ErrBadFrame, want: Request{Op: OpRelease, ID: 5}},

		// renew
		{name: "renew", in: rawRenew(30, 77, "lock/a"), want: Request{Op: OpRenew, Lease: 30, ID: 77, Key: []byte("lock/a")}},
		{name: "renew/newlines-in-header", in: rawRenew('\n', nl8, "k"), want: Request{Op: OpRenew, Lease: '\n', ID: nl8, Key: []byte("k")}},
		{name: "renew/token0", in: rawRenew(1, 0, "k"), want: Request{Op: OpRenew, Lease: 1, Key: []byte("k")}},
		// The parser knows no state: a renew with lease 0 is E 3 whatever its
		// token, stale or current.
		{name: "renew/lease0-any-token", in: rawRenew(0, 1, "k"), err: ErrBadLease, want: Request{Op: OpRenew, ID: 1, Key: []byte("k")}},
		{name: "renew/bad-key-lease0", in: rawRenew(0, 1, ""), err: ErrBadKey, want: Request{Op: OpRenew, ID: 1, Key: []byte("")}},
		{name: "renew/invalid-utf8-lease0", in: rawRenew(0, 1, "\x80"), err: ErrBadKey, want: Request{Op: OpRenew, ID: 1, Key: []byte("\x80")}},
		{name: "renew/over-maxKey-lease0", in: rawRenew(0, 1, "abc"), maxKey: 2, err: ErrBadKey, want: Request{Op: OpRenew, ID: 1, Key: []byte("abc")}},
		{name: "renew/key1025", in: rawRenew(0, 1, k1025), n: 1 + 9 + 1025, err: ErrBadFrame, want: Request{Op: OpRenew, ID: 1}},

		// ping
		{name: "ping", in: rawPing(99), want: Request{Op: OpPing, ID: 99}},
		{name: "ping/nonce0", in: rawPing(0), want: Request{Op: OpPing}},
		{name: "ping/newlines-in-header", in: rawPing(nl8), want: Request{Op: OpPing, ID: nl8}},
		{name: "ping/tail", in: "P" + be64(99) + "x\n", n: 10, err: ErrBadFrame, want: Request{Op: OpPing, ID: 99}},
		{name: "ping/tail-no-newline", in: "P" + be64(99) + "x", n: 10, err: ErrBadFrame, want: Request{Op: OpPing, ID: 99}},

		// hello: the tail is taken whole, unjudged (SplitHello judges it)
		{name: "hello", in: rawIDTail('H', 5, "orders s3cret"), want: Request{Op: OpHello, ID: 5, Key: []byte("orders s3cret")}},
		{name: "hello/secret-with-spaces", in: rawIDTail('H', 5, "orders a b  c "), want: Request{Op: OpHello, ID: 5, Key: []byte("orders a b  c ")}},
		{name: "hello/empty-tail", in: rawIDTail('H', 0, ""), want: Request{Op: OpHello, Key: []byte("")}},
		{name: "hello/no-space", in: rawIDTail('H', 1, "orders"), want: Request{Op: OpHello, ID: 1, Key: []byte("orders")}},
		{name: "hello/invalid-utf8", in: rawIDTail('H', 1, "a ÿ"), want: Request{Op: OpHello, ID: 1, Key: []byte("a ÿ")}},
		{name: "hello/tail1024", in: rawIDTail('H', 1, k1024), maxKey: 16, want: Request{Op: OpHello, ID: 1, Key: []byte(k1024)}},
		{name: "hello/tail1025", in: rawIDTail('H', 1, k1025), n: 1 + 8 + 1025, err: ErrBadFrame, want: Request{Op: OpHello, ID: 1}},
		{name: "hello/newlines-in-header", in: rawIDTail('H', nl8, "a b"), want: Request{Op: OpHello, ID: nl8, Key: []byte("a b")}},

		// acquire shared (PROTOCOL.md §9.2): frame, key, lease, then limit 0
		{name: "shared", in: rawShared(5, 30, 7, 4, "sem/a"), want: shr(5, 30, 7, 4, "sem/a")},
		{name: "shared/limit1", in: rawShared(0, 1, 0, 1, "k"), want: shr(0, 1, 0, 1, "k")},
		{name: "shared/limit65535", in: rawShared(255, 255, 1<<64-1, 65535, k1024), want: shr(255, 255, 1<<64-1, 65535, k1024)},
		{name: "shared/newlines-in-header", in: rawShared('\n', '\n', nl8, 0x0A0A, "k"), want: shr('\n', '\n', nl8, 0x0A0A, "k")},
		{name: "shared/limit0", in: rawShared(1, 2, 3, 0, "k"), err: ErrBadLimit, want: shr(1, 2, 3, 0, "k")},
		{name: "shared/lease0-before-limit0", in: rawShared(1, 0, 3, 0, "k"), err: ErrBadLease, want: shr(1, 0, 3, 0, "k")},
		{name: "shared/lease0", in: rawShared(1, 0, 3, 5, "k"), err: ErrBadLease, want: shr(1, 0, 3, 5, "k")},
		{name: "shared/bad-key-before-lease0-limit0", in: rawShared(1, 0, 3, 0, "\xff"), err: ErrBadKey, want: shr(1, 0, 3, 0, "\xff")},
		{name: "shared/empty-key", in: rawShared(1, 1, 3, 2, ""), err: ErrBadKey, want: shr(1, 1, 3, 2, "")},
		{name: "shared/over-maxKey", in: rawShared(1, 1, 3, 2, "abc"), maxKey: 2, err: ErrBadKey, want: shr(1, 1, 3, 2, "abc")},
		{name: "shared/key1025", in: rawShared(1, 0, 3, 0, k1025), n: 1 + 12 + 1025, err: ErrBadFrame, want: Request{Op: OpShared, Wait: 1, ID: 3}},

		// validate, watch, inspect: id and key, no lease
		{name: "validate", in: rawIDTail('V', 77, "lock/a"), want: Request{Op: OpValidate, ID: 77, Key: []byte("lock/a")}},
		{name: "validate/token0", in: rawIDTail('V', 0, "k"), want: Request{Op: OpValidate, Key: []byte("k")}},
		{name: "validate/bad-key", in: rawIDTail('V', 7, "\x80"), err: ErrBadKey, want: Request{Op: OpValidate, ID: 7, Key: []byte("\x80")}},
		{name: "validate/key1025", in: rawIDTail('V', 7, k1025), n: 1 + 8 + 1025, err: ErrBadFrame, want: Request{Op: OpValidate, ID: 7}},
		{name: "watch", in: rawIDTail('W', nl8, "lock/a"), want: Request{Op: OpWatch, ID: nl8, Key: []byte("lock/a")}},
		{name: "watch/empty-key", in: rawIDTail('W', 7, ""), err: ErrBadKey, want: Request{Op: OpWatch, ID: 7, Key: []byte("")}},
		{name: "watch/over-maxKey", in: rawIDTail('W', 7, "abc"), maxKey: 1, err: ErrBadKey, want: Request{Op: OpWatch, ID: 7, Key: []byte("abc")}},
		{name: "inspect", in: rawIDTail('I', 9, "k"), want: Request{Op: OpInspect, ID: 9, Key: []byte("k")}},
		{name: "inspect/key1024", in: rawIDTail('I', 9, k1024), want: Request{Op: OpInspect, ID: 9, Key: []byte(k1024)}},
		{name: "inspect/bad-key", in: rawIDTail('I', 9, "a\xffb"), err: ErrBadKey, want: Request{Op: OpInspect, ID: 9, Key: []byte("a\xffb")}},

		// unknown ops
		{name: "unknown/Z", in: "Z" + be64(1) + "k\n", n: 1, err: ErrBadFrame, want: Request{Op: 'Z'}},
		{name: "unknown/newline", in: "\n", n: 1, err: ErrBadFrame, want: Request{Op: '\n'}},
		{name: "unknown/newline-then-frame", in: "\n" + rawPing(1), n: 1, err: ErrBadFrame, want: Request{Op: '\n'}},
		{name: "unknown/nul", in: "\x00", n: 1, err: ErrBadFrame, want: Request{Op: 0}},
		{name: "unknown/lowercase", in: "a" + be64(1), n: 1, err: ErrBadFrame, want: Request{Op: 'a'}},
		{name: "unknown/response-only-T", in: rawIDTail('T', 1, "k"), n: 1, err: ErrBadFrame, want: Request{Op: OpTimeout}},
		{name: "unknown/response-only-E", in: rawError('A', 1, 2, "m"), n: 1, err: ErrBadFrame, want: Request{Op: OpError}},
		{name: "unknown/response-only-L", in: rawLost(1, 1, "k"), n: 1, err: ErrBadFrame, want: Request{Op: OpLost}},
		{name: "unknown/0xff", in: "\xff", n: 1, err: ErrBadFrame, want: Request{Op: 0xff}},

		// incomplete
		{name: "incomplete/empty", in: "", err: ErrIncomplete},
		{name: "incomplete/op-only", in: "A", err: ErrIncomplete},
		{name: "incomplete/short-header", in: "A\x01\x02" + be64(3)[:7], err: ErrIncomplete},
		{name: "incomplete/newline-in-short-header", in: "R\n\n\n", err: ErrIncomplete},
		{name: "incomplete/header-only", in: "A\x01\x02" + be64(3), err: ErrIncomplete},
		{name: "incomplete/key-no-newline", in: "R" + be64(3) + "abc", err: ErrIncomplete},
		{name: "incomplete/key1024-no-newline", in: "R" + be64(3) + k1024, err: ErrIncomplete},
		{name: "incomplete/ping-header-only", in: "P" + be64(3), err: ErrIncomplete},
		{name: "incomplete/hello-no-newline", in: "H" + be64(3) + "a b", err: ErrIncomplete},
		{name: "incomplete/shared-header-only", in: "S\x01\x02" + be64(3) + be16(4), err: ErrIncomplete},
		{name: "incomplete/shared-short-header", in: "S\x01\x02" + be64(3) + "\x00", err: ErrIncomplete},
		{name: "incomplete/inspect-no-newline", in: "I" + be64(3) + "k", err: ErrIncomplete},
	}
}

func checkRequest(t *testing.T, in []byte, n int, err error, r *Request, c reqCase) {
	t.Helper()
	if err != c.err {
		t.Fatalf("err = %v, want %v", err, c.err)
	}
	wantN := c.n
	if wantN == 0 && c.err != ErrIncomplete {
		wantN = len(in)
	}
	if n != wantN {
		t.Fatalf("n = %d, want %d", n, wantN)
	}
	if err == ErrIncomplete {
		return
	}
	if !sameRequest(r, &c.want) {
		t.Fatalf("request = %+v, want %+v", *r, c.want)
	}
	if r.Key != nil && (!within(r.Key, in) || cap(r.Key) != len(r.Key)) {
		t.Fatalf("Key is not a capacity-capped slice of the input")
	}
}

func TestParseRequest(t *testing.T) {
	for _, c := range reqCases() {
		t.Run(c.name, func(t *testing.T) {
			in := []byte(c.in)
			r := Request{Op: 'x', Wait: 9, Lease: 9, ID: 9, Key: []byte("stale")} // must be overwritten
			n, err := ParseRequest(in, c.maxKey, &r)
			checkRequest(t, in, n, err, &r, c)
			if got := Code(err); got != Code(c.err) {
				t.Fatalf("Code = %d", got)
			}
		})
	}
}

// TestParseRequestSplit cuts every frame at every offset: a prefix of a frame
// that ends at its 0x0A is incomplete; a prefix of a bad frame is incomplete
// or already the same bad frame; a prefix that holds the whole first frame of
// a longer input gives that frame.
func TestParseRequestSplit(t *testing.T) {
	for _, c := range reqCases() {
		if c.err == ErrIncomplete {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			in := []byte(c.in)
			for k := 0; k < len(in); k++ {
				prefix := append([]byte(nil), in[:k]...)
				var r Request
				n, err := ParseRequest(prefix, c.maxKey, &r)
				if err == ErrIncomplete {
					if n != 0 {
						t.Fatalf("prefix %d: n = %d with ErrIncomplete", k, n)
					}
					continue
				}
				if c.err != ErrBadFrame && (c.n == 0 || k < c.n) {
					t.Fatalf("prefix %d of a whole frame: n = %d, err = %v, want ErrIncomplete", k, n, err)
				}
				checkRequest(t, prefix, n, err, &r, c)
			}
			var r Request
			n, err := ParseRequest(in, c.maxKey, &r)
			checkRequest(t, in, n, err, &r, c)
		})
	}
}

type respCase struct {
	name string
	in   string
	n    int
	err  error
	want Response
}

func respCases() []respCase {
	long := strings.Repeat("m", MaxKey+1)
	return []respCase{
		{name: "acquired", in: rawAcquired(7, 1000, "lock/a"), want: Response{Op: OpAcquire, ID: 7, Token: 1000, Tail: []byte("lock/a")}},
		{name: "acquired/newlines-in-header", in: rawAcquired(nl8, nl8, "k"), want: Response{Op: OpAcquire, ID: nl8, Token: nl8, Tail: []byte("k")}},
		{name: "acquired/key1024", in: rawAcquired(1, 2, k1024), want: Response{Op: OpAcquire, ID: 1, Token: 2, Tail: []byte(k1024)}},
		{name: "acquired/no-key-validation", in: rawAcquired(1, 2, "\xff"), want: Response{Op: OpAcquire, ID: 1, Token: 2, Tail: []byte("\xff")}},
		{name: "acquired/empty-key", in: rawAcquired(1, 2, ""), want: Response{Op: OpAcquire, ID: 1, Token: 2, Tail: []byte("")}},
		{name: "timeout", in: rawIDTail('T', 7, "lock/a"), want: Response{Op: OpTimeout, ID: 7, Tail: []byte("lock/a")}},
		{name: "timeout/newlines-in-header", in: rawIDTail('T', nl8, "k"), want: Response{Op: OpTimeout, ID: nl8, Tail: []byte("k")}},
		{name: "busy", in: rawIDTail('B', 7, "lock/a"), want: Response{Op: OpBusy, ID: 7, Tail: []byte("lock/a")}},
		{name: "released", in: rawIDTail('R', 1000, "lock/a"), want: Response{Op: OpRelease, ID: 1000, Tail: []byte("lock/a")}},
		{name: "renewed", in: rawIDTail('K', 1000, "lock/a"), want: Response{Op: OpRenew, ID: 1000, Tail: []byte("lock/a")}},
		{name: "not-held/release", in: rawOpIDTail('N', 'R', 1000, "lock/a"), want: Response{Op: OpNotHeld, ReqOp: OpRelease, ID: 1000, Tail: []byte("lock/a")}},
		{name: "not-held/renew", in: rawOpIDTail('N', 'K', 1000, "lock/a"), want: Response{Op: OpNotHeld, ReqOp: OpRenew, ID: 1000, Tail: []byte("lock/a")}},
		{name: "not-held/newline-op", in: rawOpIDTail('N', '\n', nl8, "k"), want: Response{Op: OpNotHeld, ReqOp: '\n', ID: nl8, Tail: []byte("k")}},
		{name: "pong", in: rawPing(42), want: Response{Op: OpPing, ID: 42}},
		{name: "pong/newlines-in-header", in: rawPing(nl8), want: Response{Op: OpPing, ID: nl8}},
		{name: "moved", in: rawOpIDTail('M', 'A', 7, "10.0.0.2:7070"), want: Response{Op: OpMoved, ReqOp: OpAcquire, ID: 7, Tail: []byte("10.0.0.2:7070")}},
		{name: "moved/unknown-active", in: rawOpIDTail('M', 'P', 7, ""), want: Response{Op: OpMoved, ReqOp: OpPing, ID: 7, Tail: []byte("")}},
		{name: "error", in: rawError('A', 7, CodeBadKey, "bad key"), want: Response{Op: OpError, ReqOp: OpAcquire, ID: 7, Code: CodeBadKey, Tail: []byte("bad key")}},
		{name: "error/newlines-in-header", in: rawError('\n', nl8, '\n', "m"), want: Response{Op: OpError, ReqOp: '\n', ID: nl8, Code: '\n', Tail: []byte("m")}},
		{name: "error/empty-message", in: rawError('Z', 0, CodeBadFrame, ""), want: Response{Op: OpError, ReqOp: 'Z', Code: CodeBadFrame, Tail: []byte("")}},
		{name: "error/message1024", in: rawError('R', 3, CodeShutdown, k1024), want: Response{Op: OpError, ReqOp: OpRelease, ID: 3, Code: CodeShutdown, Tail: []byte(k1024)}},
		{name: "welcome", in: rawIDTail('H', 5, "orders"), want: Response{Op: OpHello, ID: 5, Tail: []byte("orders")}},
		{name: "welcome/empty-identity", in: rawIDTail('H', 0, ""), want: Response{Op: OpHello, Tail: []byte("")}},
		{name: "followed-by-more", in: rawPing(1) + rawPing(2), n: 10, want: Response{Op: OpPing, ID: 1}},

		// PROTOCOL.md §9
		{name: "valid", in: rawValid(1000, 29999, "lock/a"), want: Response{Op: OpValidate, ID: 1000, Remaining: 29999, Tail: []byte("lock/a")}},
		{name: "valid/newlines-in-header", in: rawValid(nl8, 0x0A0A0A0A, "k"), want: Response{Op: OpValidate, ID: nl8, Remaining: 0x0A0A0A0A, Tail: []byte("k")}},
		{name: "valid/remaining0", in: rawValid(1, 0, "k"), want: Response{Op: OpValidate, ID: 1, Tail: []byte("k")}},
		{name: "watching", in: rawIDTail('W', 1000, "lock/a"), want: Response{Op: OpWatch, ID: 1000, Tail: []byte("lock/a")}},
		{name: "lost/released", in: rawLost(1000, ReasonReleased, "lock/a"), want: Response{Op: OpLost, ID: 1000, Reason: 1, Tail: []byte("lock/a")}},
		{name: "lost/expired", in: rawLost(1000, ReasonExpired, "k"), want: Response{Op: OpLost, ID: 1000, Reason: 2, Tail: []byte("k")}},
		{name: "lost/forced", in: rawLost(1000, ReasonForced, "k"), want: Response{Op: OpLost, ID: 1000, Reason: 3, Tail: []byte("k")}},
		{name: "lost/cannot-tell", in: rawLost(1000, ReasonCannotTell, "k"), want: Response{Op: OpLost, ID: 1000, Reason: 4, Tail: []byte("k")}},
		{name: "lost/unknown-reason-unchecked", in: rawLost(nl8, '\n', "k"), want: Response{Op: OpLost, ID: nl8, Reason: '\n', Tail: []byte("k")}},
		{name: "inspection", in: rawInspection(9, 3, 4, 5, 1007, 2500, "sem/a"),
			want: Response{Op: OpInspect, ID: 9, Holders: 3, Limit: 4, Waiters: 5, Token: 1007, Remaining: 2500, Tail: []byte("sem/a")}},
		{name: "inspection/free", in: rawInspection(9, 0, 0, 0, 0, 0, "k"), want: Response{Op: OpInspect, ID: 9, Tail: []byte("k")}},
		{name: "inspection/max", in: rawInspection(1<<64-1, 65535, 65535, 1<<32-1, 1<<64-1, 1<<32-1, k1024),
			want: Response{Op: OpInspect, ID: 1<<64 - 1, Holders: 65535, Limit: 65535, Waiters: 1<<32 - 1, Token: 1<<64 - 1, Remaining: 1<<32 - 1, Tail: []byte(k1024)}},
		{name: "inspection/newlines-in-header", in: rawInspection(nl8, 0x0A0A, 0x0A0A, 0x0A0A0A0A, nl8, 0x0A0A0A0A, "k"),
			want: Response{Op: OpInspect, ID: nl8, Holders: 0x0A0A, Limit: 0x0A0A, Waiters: 0x0A0A0A0A, Token: nl8, Remaining: 0x0A0A0A0A, Tail: []byte("k")}},
		{name: "not-held/validate", in: rawOpIDTail('N', 'V', 1000, "k"), want: Response{Op: OpNotHeld, ReqOp: OpValidate, ID: 1000, Tail: []byte("k")}},
		{name: "not-held/watch", in: rawOpIDTail('N', 'W', 1000, "k"), want: Response{Op: OpNotHeld, ReqOp: OpWatch, ID: 1000, Tail: []byte("k")}},
		{name: "error/limit-mismatch", in: rawError('S', 7, CodeLimitMismatch, "limit mismatch"), want: Response{Op: OpError, ReqOp: OpShared, ID: 7, Code: 7, Tail: []byte("limit mismatch")}},
		{name: "error/limit-reached", in: rawError('W', 7, CodeLimitReached, "too many watches"), want: Response{Op: OpError, ReqOp: OpWatch, ID: 7, Code: 8, Tail: []byte("too many watches")}},
		{name: "bad/inspection-tail1025", in: rawInspection(9, 1, 1, 0, 5, 6, long), n: 1 + 28 + 1025, err: ErrBadFrame,
			want: Response{Op: OpInspect, ID: 9, Holders: 1, Limit: 1, Token: 5, Remaining: 6}},
		{name: "bad/shared-is-no-response", in: rawShared(1, 1, 1, 1, "k"), n: 1, err: ErrBadFrame, want: Response{Op: OpShared}},
		{name: "incomplete/inspection-short-header", in: "I" + be64(9) + be16(1) + be16(1) + be32(0) + be64(5), err: ErrIncomplete},
		{name: "incomplete/lost-header-only", in: "L" + be64(9) + "\x01", err: ErrIncomplete},

		{name: "bad/unknown-op", in: "Z" + be64(1) + "\n", n: 1, err: ErrBadFrame, want: Response{Op: 'Z'}},
		{name: "bad/newline-op", in: "\n", n: 1, err: ErrBadFrame, want: Response{Op: '\n'}},
		{name: "bad/lowercase-op", in: "a", n: 1, err: ErrBadFrame, want: Response{Op: 'a'}},
		{name: "bad/pong-tail", in: "P" + be64(5) + "x\n", n: 10, err: ErrBadFrame, want: Response{Op: OpPing, ID: 5}},
		{name: "bad/tail1025", in: rawAcquired(1, 2, long), n: 1 + 16 + 1025, err: ErrBadFrame, want: Response{Op: OpAcquire, ID: 1, Token: 2}},
		{name: "bad/message1025-no-newline", in: "E" + "A" + be64(3) + "\x02" + long, n: 1 + 10 + 1025, err: ErrBadFrame, want: Response{Op: OpError, ReqOp: OpAcquire, ID: 3, Code: 2}},

		{name: "incomplete/empty", in: "", err: ErrIncomplete},
		{name: "incomplete/op-only", in: "A", err: ErrIncomplete},
		{name: "incomplete/short-header", in: "A" + be64(1) + be64(2)[:7], err: ErrIncomplete},
		{name: "incomplete/header-only", in: "E" + "A" + be64(3) + "\x02", err: ErrIncomplete},
		{name: "incomplete/tail1024", in: "M" + "A" + be64(3) + k1024, err: ErrIncomplete},
		{name: "incomplete/pong-header-only", in: "P" + be64(5), err: ErrIncomplete},
	}
}

func checkResponse(t *testing.T, in []byte, n int, err error, r *Response, c respCase) {
	t.Helper()
	if err != c.err {
		t.Fatalf("err = %v, want %v", err, c.err)
	}
	wantN := c.n
	if wantN == 0 && c.err != ErrIncomplete {
		wantN = len(in)
	}
	if n != wantN {
		t.Fatalf("n = %d, want %d", n, wantN)
	}
	if err == ErrIncomplete {
		return
	}
	if !sameResponse(r, &c.want) {
		t.Fatalf("response = %+v, want %+v", *r, c.want)
	}
	if r.Tail != nil && (!within(r.Tail, in) || cap(r.Tail) != len(r.Tail)) {
		t.Fatalf("Tail is not a capacity-capped slice of the input")
	}
}

func TestParseResponse(t *testing.T) {
	for _, c := range respCases() {
		t.Run(c.name, func(t *testing.T) {
			in := []byte(c.in)
			r := Response{Op: 'x', ReqOp: 'y', ID: 9, Token: 9, Code: 9, Tail: []byte("stale")}
			n, err := ParseResponse(in, &r)
			checkResponse(t, in, n, err, &r, c)
		})
	}
}

func TestParseResponseSplit(t *testing.T) {
	for _, c := range respCases() {
		if c.err == ErrIncomplete {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			in := []byte(c.in)
			for k := 0; k < len(in); k++ {
				prefix := append([]byte(nil), in[:k]...)
				var r Response
				n, err := ParseResponse(prefix, &r)
				if err == ErrIncomplete {
					if n != 0 {
						t.Fatalf("prefix %d: n = %d with ErrIncomplete", k, n)
					}
					continue
				}
				if c.err != ErrBadFrame && (c.n == 0 || k < c.n) {
					t.Fatalf("prefix %d of a whole frame: n = %d, err = %v, want ErrIncomplete", k, n, err)
				}
				checkResponse(t, prefix, n, err, &r, c)
			}
			var r Response
			n, err := ParseResponse(in, &r)
			checkResponse(t, in, n, err, &r, c)
		})
	}
}

// randomKey returns a key of 1..64 bytes, sometimes with multi-byte runes,
// control bytes or (bad == true) an invalid byte.
func randomKey(rng *rand.Rand, bad bool) string {
	var b strings.Builder
	for n := 1 + rng.IntN(64); b.Len() < n; {
		switch rng.IntN(8) {
		case 0:
			b.WriteString("é")
		case 1:
			c := byte(rng.IntN(0x20)) // a control byte, NUL included, never 0x0A
			if c == '\n' {
				c = 0
			}
			b.WriteByte(c)
		default:
			b.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	if bad {
		return b.String() + "\xff"
	}
	return b.String()
}

type pipelined struct {
	in   []byte
	errs []error
	reqs []Request
}

// pipelineRequests builds frames request frames in one buffer. Unless
// typical, they include odd keys and frames the server answers with E 2 or
// E 3 and goes on; typical ones are valid, with ASCII keys of 8 to 40 bytes.
func pipelineRequests(frames int, seed uint64, typical bool) pipelined {
	rng := rand.New(rand.NewPCG(seed, seed))
	randomKey := randomKey
	kinds := 12
	if typical {
		randomKey = func(rng *rand.Rand, _ bool) string {
			return k16[:8+rng.IntN(9)] + k16[:rng.IntN(17)] + k16[:rng.IntN(8)]
		}
		kinds = 5
	}
	var p pipelined
	for range frames {
		id := rng.Uint64()
		if rng.IntN(8) == 0 {
			id = nl8
		}
		var r Request
		var err error
		switch rng.IntN(kinds) {
		case 0, 1:
			r = Request{Op: OpAcquire, Wait: uint8(rng.UintN(256)), Lease: uint8(1 + rng.UintN(255)), ID: id, Key: []byte(randomKey(rng, false))}
			p.in = append(p.in, rawAcquire(r.Wait, r.Lease, r.ID, string(r.Key))...)
		case 2:
			r = Request{Op: OpRelease, ID: id, Key: []byte(randomKey(rng, false))}
			p.in = append(p.in, rawRelease(r.ID, string(r.Key))...)
		case 3:
			r = Request{Op: OpRenew, Lease: uint8(1 + rng.UintN(255)), ID: id, Key: []byte(randomKey(rng, false))}
			p.in = append(p.in, rawRenew(r.Lease, r.ID, string(r.Key))...)
		case 4:
			r = Request{Op: OpPing, ID: id}
			p.in = append(p.in, rawPing(r.ID)...)
		case 5:
			r = Request{Op: OpRenew, Lease: 0, ID: id, Key: []byte(randomKey(rng, false))}
			p.in = append(p.in, rawRenew(r.Lease, r.ID, string(r.Key))...)
			err = ErrBadLease
		case 6:
			r = Request{Op: OpRelease, ID: id, Key: []byte(randomKey(rng, true))}
			p.in = append(p.in, rawRelease(r.ID, string(r.Key))...)
			err = ErrBadKey
		case 7:
			r = Request{Op: OpShared, Wait: uint8(rng.UintN(256)), Lease: uint8(1 + rng.UintN(255)), Limit: uint16(rng.UintN(65536)), ID: id, Key: []byte(randomKey(rng, false))}
			p.in = append(p.in, rawShared(r.Wait, r.Lease, r.ID, r.Limit, string(r.Key))...)
			if r.Limit == 0 {
				err = ErrBadLimit
			}
		case 8, 9, 10:
			r = Request{Op: [...]Op{OpValidate, OpWatch, OpInspect}[rng.IntN(3)], ID: id, Key: []byte(randomKey(rng, false))}
			p.in = append(p.in, rawIDTail(byte(r.Op), r.ID, string(r.Key))...)
		case 11:
			r = Request{Op: OpShared, Wait: 1, Lease: 1, Limit: 0, ID: id, Key: []byte(randomKey(rng, false))}
			p.in = append(p.in, rawShared(r.Wait, r.Lease, r.ID, r.Limit, string(r.Key))...)
			err = ErrBadLimit
		}
		p.reqs = append(p.reqs, r)
		p.errs = append(p.errs, err)
	}
	return p
}

func TestParseRequestPipelined(t *testing.T) {
	p := pipelineRequests(1000, 1, false)
	off, i := 0, 0
	for off < len(p.in) {
		var r Request
		n, err := ParseRequest(p.in[off:], MaxKey, &r)
		if i >= len(p.reqs) {
			t.Fatalf("frame %d at offset %d: more frames than encoded", i, off)
		}
		if err != p.errs[i] || !sameRequest(&r, &p.reqs[i]) {
			t.Fatalf("frame %d at offset %d: %+v, %v; want %+v, %v", i, off, r, err, p.reqs[i], p.errs[i])
		}
		off += n
		i++
	}
	if off != len(p.in) || i != 1000 {
		t.Fatalf("consumed %d of %d bytes in %d frames", off, len(p.in), i)
	}
	var r Request
	if n, err := ParseRequest(p.in[off:], MaxKey, &r); n != 0 || err != ErrIncomplete {
		t.Fatalf("after the last frame: %d, %v", n, err)
	}
}

func TestParseResponsePipelined(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	var in []byte
	var want []Response
	for range 1000 {
		id, tok, key := rng.Uint64(), rng.Uint64(), []byte(randomKey(rng, rng.IntN(4) == 0))
		var r Response
		switch rng.IntN(13) {
		case 9:
			r = Response{Op: OpValidate, ID: id, Remaining: rng.Uint32(), Tail: key}
			in = append(in, rawValid(id, r.Remaining, string(key))...)
		case 10:
			r = Response{Op: OpWatch, ID: id, Tail: key}
			in = append(in, rawIDTail('W', id, string(key))...)
		case 11:
			r = Response{Op: OpLost, ID: id, Reason: uint8(1 + rng.IntN(4)), Tail: key}
			in = append(in, rawLost(id, r.Reason, string(key))...)
		case 12:
			r = Response{Op: OpInspect, ID: id, Holders: uint16(rng.Uint32()), Limit: uint16(rng.Uint32()), Waiters: rng.Uint32(), Token: tok, Remaining: rng.Uint32(), Tail: key}
			in = append(in, rawInspection(id, r.Holders, r.Limit, r.Waiters, tok, r.Remaining, string(key))...)
		case 0:
			r = Response{Op: OpAcquire, ID: id, Token: tok, Tail: key}
			in = append(in, rawAcquired(id, tok, string(key))...)
		case 1:
			r = Response{Op: OpTimeout, ID: id, Tail: key}
		case 2:
			r = Response{Op: OpBusy, ID: id, Tail: key}
		case 3:
			r = Response{Op: OpRelease, ID: id, Tail: key}
		case 4:
			r = Response{Op: OpRenew, ID: id, Tail: key}
		case 5:
			r = Response{Op: OpNotHeld, ReqOp: OpRenew, ID: id, Tail: key}
			in = append(in, rawOpIDTail('N', 'K', id, string(key))...)
		case 6:
			r = Response{Op: OpPing, ID: id}
			in = append(in, rawPing(id)...)
		case 7:
			r = Response{Op: OpMoved, ReqOp: OpAcquire, ID: id, Tail: []byte("10.1.2.3:7000")}
			in = append(in, rawOpIDTail('M', 'A', id, "10.1.2.3:7000")...)
		case 8:
			r = Response{Op: OpError, ReqOp: OpRelease, ID: id, Code: CodeShutdown, Tail: []byte("shutting down")}
			in = append(in, rawError('R', id, CodeShutdown, "shutting down")...)
		}
		switch r.Op {
		case OpTimeout, OpBusy, OpRelease, OpRenew:
			in = append(in, rawIDTail(byte(r.Op), id, string(key))...)
		}
		want = append(want, r)
	}
	off, i := 0, 0
	for off < len(in) {
		var r Response
		n, err := ParseResponse(in[off:], &r)
		if err != nil || i >= len(want) || !sameResponse(&r, &want[i]) {
			t.Fatalf("frame %d at offset %d: %+v, %v", i, off, r, err)
		}
		off += n
		i++
	}
	if off != len(in) || i != 1000 {
		t.Fatalf("consumed %d of %d bytes in %d frames", off, len(in), i)
	}
}

func TestOpString(t *testing.T) {
	for _, c := range []struct {
		op   Op
		want string
	}{
		{OpAcquire, "acquire"}, {OpRelease, "release"}, {OpRenew, "renew"}, {OpPing, "ping"},
		{OpTimeout, "timeout"}, {OpBusy, "busy"}, {OpNotHeld, "not-held"}, {OpMoved, "moved"},
		{OpError, "error"}, {OpHello, "hello"}, {OpShared, "acquire-shared"}, {OpValidate, "validate"},
		{OpWatch, "watch"}, {OpInspect, "inspect"}, {OpLost, "lost"}, {7, "op(0x07)"}, {'\n', "op(0x0a)"}, {0xff, "op(0xff)"}, {'Z', "op(0x5a)"},
	} {
		t.Run(c.want, func(t *testing.T) {
			if got := c.op.String(); got != c.want {
				t.Fatalf("Op(%#x).String() = %q, want %q", byte(c.op), got, c.want)
			}
		})
	}
}

func TestOpKinds(t *testing.T) {
	for o := 0; o < 256; o++ {
		op := Op(o)
		rl, rok := RequestHeaderLen(op)
		sl, sok := ResponseHeaderLen(op)
		if rok != op.IsRequest() || sok != op.IsResponse() {
			t.Fatalf("%v: header-length and Is* disagree", op)
		}
		wantReq := map[Op]int{OpAcquire: 10, OpRelease: 8, OpRenew: 9, OpPing: 8, OpHello: 8,
			OpShared: 12, OpValidate: 8, OpWatch: 8, OpInspect: 8}
		wantResp := map[Op]int{OpAcquire: 16, OpTimeout: 8, OpBusy: 8, OpRelease: 8, OpRenew: 8, OpNotHeld: 9, OpPing: 8, OpMoved: 9, OpError: 10, OpHello: 8,
			OpValidate: 12, OpWatch: 8, OpLost: 9, OpInspect: 28}
		if w, ok := wantReq[op]; ok != rok || w != rl {
			t.Fatalf("RequestHeaderLen(%v) = %d, %v", op, rl, rok)
		}
		if w, ok := wantResp[op]; ok != sok || w != sl {
			t.Fatalf("ResponseHeaderLen(%v) = %d, %v", op, sl, sok)
		}
	}
	if MaxRequestLen != len(rawShared(1, 1, 1, 1, k1024)) || MaxResponseLen != len(rawInspection(1, 1, 1, 1, 1, 1, k1024)) {
		t.Fatalf("MaxRequestLen %d, MaxResponseLen %d", MaxRequestLen, MaxResponseLen)
	}
}

type wrapped struct{ err error }

func (w wrapped) Error() string { return "wrapped: " + w.err.Error() }
func (w wrapped) Unwrap() error { return w.err }

func TestCode(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want uint8
	}{
		{"nil", nil, 0},
		{"incomplete", ErrIncomplete, 0},
		{"bad-frame", ErrBadFrame, CodeBadFrame},
		{"bad-key", ErrBadKey, CodeBadKey},
		{"bad-lease", ErrBadLease, CodeBadLease},
		{"bad-limit", ErrBadLimit, CodeLimitMismatch},
		{"wrapped-bad-limit", wrapped{ErrBadLimit}, CodeLimitMismatch},
		{"wrapped-bad-key", wrapped{ErrBadKey}, CodeBadKey},
		{"other", errors.New("x"), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Code(c.err); got != c.want {
				t.Fatalf("Code(%v) = %d, want %d", c.err, got, c.want)
			}
		})
	}
}

// TestValidKey compares the ASCII fast path with utf8.Valid for every
// position of a non-ASCII byte, a rune or an invalid byte in short keys.
func TestValidKey(t *testing.T) {
	for n := 0; n <= 24; n++ {
		base := strings.Repeat("a", n)
		for i := 0; i <= n; i++ {
			for _, ins := range []string{"", "é", "€", "🔒", "\xff", "\x80", "\xe2\x82", "\x00", "\x7f"} {
				key := []byte(base[:i] + ins + base[i:])
				if got, want := validKey(key), utf8.Valid(key); got != want {
					t.Fatalf("validKey(%q) = %v, want %v", key, got, want)
				}
			}
		}
	}
}

func TestRequestIndex(t *testing.T) {
	for b := 0; b < 256; b++ {
		op := Op(b)
		i := op.RequestIndex()
		if (i >= 0) != op.IsRequest() {
			t.Fatalf("%v: RequestIndex %d, IsRequest %v", op, i, op.IsRequest())
		}
		if i >= 0 && RequestOps[i] != op {
			t.Fatalf("RequestOps[%d] = %v, want %v", i, RequestOps[i], op)
		}
	}
}

func TestSplitHello(t *testing.T) {
	secret256 := strings.Repeat("s", MaxSecret)
	for _, c := range []struct {
		name, tail, identity, secret string
		ok                           bool
	}{
		{"plain", "orders s3cret", "orders", "s3cret", true},
		{"secret keeps its spaces", "orders  a b ", "orders", " a b ", true},
		{"secret of one space", "orders  ", "orders", " ", true},
		{"secret 256", "o " + secret256, "o", secret256, true},
		{"secret 257", "o " + secret256 + "x", "", "", false},
		{"no space", "orders", "", "", false},
		{"empty identity", " s3cret", "", "", false},
		{"empty secret", "orders ", "", "", false},
		{"empty", "", "", "", false},
		{"identity bytes unjudged", "a\xffb s", "a\xffb", "s", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			id, sec, ok := SplitHello([]byte(c.tail))
			if ok != c.ok || string(id) != c.identity || string(sec) != c.secret {
				t.Fatalf("SplitHello(%q) = %q, %q, %v; want %q, %q, %v", c.tail, id, sec, ok, c.identity, c.secret, c.ok)
			}
		})
	}
}

func TestHelloIdentity(t *testing.T) {
	for _, c := range []struct{ tail, want string }{
		{"orders s3cret", "orders"}, {"orders", "orders"}, {"", ""}, {" s", ""}, {"a b c", "a"},
	} {
		if got := HelloIdentity([]byte(c.tail)); string(got) != c.want {
			t.Errorf("HelloIdentity(%q) = %q, want %q", c.tail, got, c.want)
		}
	}
}
