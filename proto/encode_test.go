package proto

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

type encCase struct {
	name string
	enc  func(dst []byte) []byte
	want string
	req  *Request  // the request ParseRequest must return, or nil for a response
	resp *Response // the response ParseResponse must return
}

func encCases() []encCase {
	key, keyB := "lock/é", []byte("lock/é")
	return []encCase{
		{name: "acquire/string", enc: func(d []byte) []byte { return AppendAcquire(d, 5, 30, 0x0102030405060708, key) },
			want: rawAcquire(5, 30, 0x0102030405060708, key), req: &Request{Op: OpAcquire, Wait: 5, Lease: 30, ID: 0x0102030405060708, Key: keyB}},
		{name: "acquire/bytes", enc: func(d []byte) []byte { return AppendAcquire(d, 0, 255, nl8, keyB) },
			want: rawAcquire(0, 255, nl8, key), req: &Request{Op: OpAcquire, Lease: 255, ID: nl8, Key: keyB}},
		{name: "acquire/key1024", enc: func(d []byte) []byte { return AppendAcquire(d, 1, 1, 1, k1024) },
			want: rawAcquire(1, 1, 1, k1024), req: &Request{Op: OpAcquire, Wait: 1, Lease: 1, ID: 1, Key: []byte(k1024)}},
		{name: "release/string", enc: func(d []byte) []byte { return AppendRelease(d, 99, key) },
			want: rawRelease(99, key), req: &Request{Op: OpRelease, ID: 99, Key: keyB}},
		{name: "release/bytes", enc: func(d []byte) []byte { return AppendRelease(d, nl8, keyB) },
			want: rawRelease(nl8, key), req: &Request{Op: OpRelease, ID: nl8, Key: keyB}},
		{name: "renew/string", enc: func(d []byte) []byte { return AppendRenew(d, 10, 99, key) },
			want: rawRenew(10, 99, key), req: &Request{Op: OpRenew, Lease: 10, ID: 99, Key: keyB}},
		{name: "renew/bytes", enc: func(d []byte) []byte { return AppendRenew(d, '\n', nl8, keyB) },
			want: rawRenew('\n', nl8, key), req: &Request{Op: OpRenew, Lease: '\n', ID: nl8, Key: keyB}},
		{name: "ping", enc: func(d []byte) []byte { return AppendPing(d, 0xdeadbeef) },
			want: rawPing(0xdeadbeef), req: &Request{Op: OpPing, ID: 0xdeadbeef}},
		{name: "ping/nonce0", enc: func(d []byte) []byte { return AppendPing(d, 0) },
			want: rawPing(0), req: &Request{Op: OpPing}},

		{name: "acquired/string", enc: func(d []byte) []byte { return AppendAcquired(d, 7, 1<<40, key) },
			want: rawAcquired(7, 1<<40, key), resp: &Response{Op: OpAcquire, ID: 7, Token: 1 << 40, Tail: keyB}},
		{name: "acquired/bytes", enc: func(d []byte) []byte { return AppendAcquired(d, nl8, nl8, keyB) },
			want: rawAcquired(nl8, nl8, key), resp: &Response{Op: OpAcquire, ID: nl8, Token: nl8, Tail: keyB}},
		{name: "timeout", enc: func(d []byte) []byte { return AppendTimeout(d, 7, key) },
			want: rawIDTail('T', 7, key), resp: &Response{Op: OpTimeout, ID: 7, Tail: keyB}},
		{name: "timeout/bytes", enc: func(d []byte) []byte { return AppendTimeout(d, 7, keyB) },
			want: rawIDTail('T', 7, key), resp: &Response{Op: OpTimeout, ID: 7, Tail: keyB}},
		{name: "busy", enc: func(d []byte) []byte { return AppendBusy(d, 7, key) },
			want: rawIDTail('B', 7, key), resp: &Response{Op: OpBusy, ID: 7, Tail: keyB}},
		{name: "busy/bytes", enc: func(d []byte) []byte { return AppendBusy(d, nl8, keyB) },
			want: rawIDTail('B', nl8, key), resp: &Response{Op: OpBusy, ID: nl8, Tail: keyB}},
		{name: "released", enc: func(d []byte) []byte { return AppendReleased(d, 1000, key) },
			want: rawIDTail('R', 1000, key), resp: &Response{Op: OpRelease, ID: 1000, Tail: keyB}},
		{name: "released/bytes", enc: func(d []byte) []byte { return AppendReleased(d, 1000, keyB) },
			want: rawIDTail('R', 1000, key), resp: &Response{Op: OpRelease, ID: 1000, Tail: keyB}},
		{name: "renewed", enc: func(d []byte) []byte { return AppendRenewed(d, 1000, key) },
			want: rawIDTail('K', 1000, key), resp: &Response{Op: OpRenew, ID: 1000, Tail: keyB}},
		{name: "renewed/bytes", enc: func(d []byte) []byte { return AppendRenewed(d, 1000, keyB) },
			want: rawIDTail('K', 1000, key), resp: &Response{Op: OpRenew, ID: 1000, Tail: keyB}},
		{name: "not-held/release", enc: func(d []byte) []byte { return AppendNotHeld(d, OpRelease, 1000, key) },
			want: rawOpIDTail('N', 'R', 1000, key), resp: &Response{Op: OpNotHeld, ReqOp: OpRelease, ID: 1000, Tail: keyB}},
		{name: "not-held/renew-bytes", enc: func(d []byte) []byte { return AppendNotHeld(d, OpRenew, 1000, keyB) },
			want: rawOpIDTail('N', 'K', 1000, key), resp: &Response{Op: OpNotHeld, ReqOp: OpRenew, ID: 1000, Tail: keyB}},
		{name: "hello", enc: func(d []byte) []byte { return AppendHello(d, 5, "orders", "s3 cret ") },
			want: rawIDTail('H', 5, "orders s3 cret "), req: &Request{Op: OpHello, ID: 5, Key: []byte("orders s3 cret ")}},
		{name: "hello/bytes", enc: func(d []byte) []byte { return AppendHello(d, nl8, []byte("o"), []byte("s")) },
			want: rawIDTail('H', nl8, "o s"), req: &Request{Op: OpHello, ID: nl8, Key: []byte("o s")}},
		{name: "welcome", enc: func(d []byte) []byte { return AppendWelcome(d, 5, "orders") },
			want: rawIDTail('H', 5, "orders"), resp: &Response{Op: OpHello, ID: 5, Tail: []byte("orders")}},
		{name: "welcome/bytes-empty", enc: func(d []byte) []byte { return AppendWelcome(d, 0, []byte{}) },
			want: rawIDTail('H', 0, ""), resp: &Response{Op: OpHello, Tail: []byte{}}},
		{name: "pong", enc: func(d []byte) []byte { return AppendPong(d, nl8) },
			want: rawPing(nl8), resp: &Response{Op: OpPing, ID: nl8}},
		{name: "moved", enc: func(d []byte) []byte { return AppendMoved(d, OpAcquire, 7, "10.0.0.2:7070") },
			want: rawOpIDTail('M', 'A', 7, "10.0.0.2:7070"), resp: &Response{Op: OpMoved, ReqOp: OpAcquire, ID: 7, Tail: []byte("10.0.0.2:7070")}},
		{name: "moved/empty-bytes", enc: func(d []byte) []byte { return AppendMoved(d, OpPing, 7, []byte(nil)) },
			want: rawOpIDTail('M', 'P', 7, ""), resp: &Response{Op: OpMoved, ReqOp: OpPing, ID: 7, Tail: []byte{}}},
		{name: "error", enc: func(d []byte) []byte { return AppendError(d, OpRenew, 9, CodeBadLease, "lease 0") },
			want: rawError('K', 9, 3, "lease 0"), resp: &Response{Op: OpError, ReqOp: OpRenew, ID: 9, Code: CodeBadLease, Tail: []byte("lease 0")}},
		{name: "error/bytes-empty", enc: func(d []byte) []byte { return AppendError(d, '\n', 0, CodeBadFrame, []byte{}) },
			want: rawError('\n', 0, 1, ""), resp: &Response{Op: OpError, ReqOp: '\n', Code: CodeBadFrame, Tail: []byte{}}},
		{name: "error/newlines", enc: func(d []byte) []byte { return AppendError(d, OpAcquire, 1, 2, "a\nb\n\nc\n") },
			want: rawError('A', 1, 2, "a b  c "), resp: &Response{Op: OpError, ReqOp: OpAcquire, ID: 1, Code: 2, Tail: []byte("a b  c ")}},
		{name: "error/message1024", enc: func(d []byte) []byte { return AppendError(d, OpAcquire, 1, 2, k1024) },
			want: rawError('A', 1, 2, k1024), resp: &Response{Op: OpError, ReqOp: OpAcquire, ID: 1, Code: 2, Tail: []byte(k1024)}},
		{name: "error/message-truncated", enc: func(d []byte) []byte { return AppendError(d, OpAcquire, 1, 2, strings.Repeat("\n", 3000)) },
			want: rawError('A', 1, 2, strings.Repeat(" ", MaxKey)), resp: &Response{Op: OpError, ReqOp: OpAcquire, ID: 1, Code: 2, Tail: []byte(strings.Repeat(" ", MaxKey))}},
	}
}

func TestEncode(t *testing.T) {
	for _, c := range encCases() {
		t.Run(c.name, func(t *testing.T) {
			got := c.enc(nil)
			if string(got) != c.want {
				t.Fatalf("got  %q\nwant %q", got, c.want)
			}
			// Appending keeps what dst held, with or without spare capacity.
			for _, dst := range [][]byte{[]byte("prefix"), append(make([]byte, 0, 4096), "prefix"...)} {
				if got := c.enc(dst); string(got) != "prefix"+c.want {
					t.Fatalf("after a prefix: %q", got)
				}
			}
			// Round trip: the frame parses back to the encoded fields, whole.
			if c.req != nil {
				var r Request
				n, err := ParseRequest(got, MaxKey, &r)
				if n != len(got) || err != nil || !sameRequest(&r, c.req) {
					t.Fatalf("ParseRequest = %d, %v, %+v; want %d, nil, %+v", n, err, r, len(got), *c.req)
				}
				if again := encodeRequest(t, nil, &r); !bytes.Equal(again, got) {
					t.Fatalf("re-encoded %q", again)
				}
				return
			}
			var r Response
			n, err := ParseResponse(got, &r)
			if n != len(got) || err != nil || !sameResponse(&r, c.resp) {
				t.Fatalf("ParseResponse = %d, %v, %+v; want %d, nil, %+v", n, err, r, len(got), *c.resp)
			}
			if again := encodeResponse(t, nil, &r); !bytes.Equal(again, got) {
				t.Fatalf("re-encoded %q", again)
			}
		})
	}
}

// TestAppendErrorTruncate checks that a long message is cut to at most
// MaxKey bytes, at a rune boundary, and always parses back.
func TestAppendErrorTruncate(t *testing.T) {
	a := func(n int) string { return strings.Repeat("a", n) }
	for _, c := range []struct {
		name, msg, want string
	}{
		{"ascii-1025", a(1025), a(1024)},
		{"ascii-3000", a(3000), a(1024)},
		{"rune-ends-at-limit", a(1021) + "€" + "b", a(1021) + "€"},
		{"rune-across-limit-1", a(1022) + "€", a(1022)},
		{"rune-across-limit-2", a(1023) + "€", a(1023)},
		{"4-byte-rune-across-limit", a(1021) + "🔒", a(1021)},
		{"4-byte-rune-ends-at-limit", a(1020) + "🔒" + "b", a(1020) + "🔒"},
		{"newline-at-limit", a(1023) + "\n" + "b", a(1023) + " "},
		{"invalid-continuations", a(1019) + strings.Repeat("\x80", 10), a(1019) + strings.Repeat("\x80", 5)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := AppendError(nil, OpAcquire, 1, CodeBadKey, c.msg)
			if want := rawError('A', 1, CodeBadKey, c.want); string(got) != want {
				t.Fatalf("message of %d bytes, want %d", len(got)-12, len(c.want))
			}
			if utf8.ValidString(c.msg) && !utf8.Valid(got) {
				t.Fatalf("cut inside a rune")
			}
			var r Response
			if n, err := ParseResponse(got, &r); n != len(got) || err != nil {
				t.Fatalf("ParseResponse = %d, %v", n, err)
			}
			// The []byte form cuts the same way and leaves msg unchanged.
			msg := []byte(c.msg)
			if gotB := AppendError(nil, OpAcquire, 1, CodeBadKey, msg); !bytes.Equal(gotB, got) || string(msg) != c.msg {
				t.Fatalf("[]byte message encoded differently")
			}
		})
	}
}
