package proto

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

func requestSeeds() [][]byte {
	return [][]byte{
		[]byte(rawAcquire(5, 30, 7, "lock/a")),
		[]byte(rawAcquire('\n', '\n', nl8, "k")),
		[]byte(rawRelease(1000, "lock/a")),
		[]byte(rawRenew(30, 1000, "lock/a")),
		[]byte(rawPing(42)),
		[]byte(rawAcquire(5, 0, 7, "k")),                 // bad lease
		[]byte(rawRenew(0, 7, "")),                       // bad key before bad lease
		[]byte(rawRelease(7, "a\xffb")),                  // bad key
		[]byte("P" + be64(1) + "x\n"),                    // ping with a tail
		[]byte("\n" + rawPing(1)),                        // 0x0A as op
		[]byte(rawAcquire(1, 2, 3, "é") + rawPing(4)),    // pipelined
		[]byte("R" + be64(3) + k1025),                    // no 0x0A in time
		[]byte(rawAcquire(1, 2, 3, "a\x00\x01\x7f\r\t")), // control bytes
		[]byte(rawIDTail('H', 9, "orders s3 cret")),      // hello
		[]byte(rawIDTail('H', 9, "orders") + rawPing(1)), // hello without a secret, then more
		[]byte(rawShared(5, 30, 7, 4, "sem/a")),          // acquire shared
		[]byte(rawShared('\n', '\n', nl8, 0x0A0A, "k")),  // 0x0A in every header byte
		[]byte(rawShared(1, 2, 3, 0, "k")),               // limit 0: E 7
		[]byte(rawShared(1, 0, 3, 0, "k")),               // lease 0 before limit 0
		[]byte(rawIDTail('V', 1000, "lock/a")),           // validate
		[]byte(rawIDTail('W', 1000, "lock/a")),           // watch
		[]byte(rawIDTail('I', 9, "lock/a")),              // inspect
		[]byte(rawIDTail('W', 9, "") + rawIDTail('I', 9, "\xff")),
	}
}

func responseSeeds() [][]byte {
	return [][]byte{
		[]byte(rawAcquired(7, 1000, "lock/a")),
		[]byte(rawAcquired(nl8, nl8, "k")),
		[]byte(rawIDTail('T', 7, "lock/a")),
		[]byte(rawIDTail('B', 7, "lock/a")),
		[]byte(rawIDTail('R', 1000, "lock/a")),
		[]byte(rawIDTail('K', 1000, "lock/a")),
		[]byte(rawOpIDTail('N', 'R', 1000, "lock/a")),
		[]byte(rawPing(42)),
		[]byte(rawOpIDTail('M', 'A', 7, "10.0.0.2:7070")),
		[]byte(rawOpIDTail('M', 'P', 7, "")),
		[]byte(rawError('A', 7, CodeBadKey, "bad key")),
		[]byte("P" + be64(1) + "x\n"),
		[]byte("\n"),
		[]byte(rawPing(1) + rawIDTail('T', 2, "k")),
		[]byte(rawIDTail('H', 9, "orders")), // welcome
		[]byte(rawValid(1000, 29999, "lock/a")),
		[]byte(rawValid(nl8, 0x0A0A0A0A, "k")),
		[]byte(rawIDTail('W', 1000, "lock/a")),
		[]byte(rawLost(1000, ReasonExpired, "lock/a")),
		[]byte(rawInspection(9, 3, 4, 5, 1007, 2500, "sem/a")),
		[]byte(rawInspection(nl8, 0x0A0A, 0x0A0A, 0x0A0A0A0A, nl8, 0x0A0A0A0A, "k")),
		[]byte(rawOpIDTail('N', 'W', 1000, "lock/a")),
		[]byte(rawError('S', 7, CodeLimitMismatch, "limit mismatch")),
	}
}

type reqResult struct {
	n   int
	err error
	r   Request
}

// streamRequests parses chunks as a connection would receive them: the
// unparsed bytes are kept and the next chunk appended, every complete frame
// is parsed, and a bad frame ends the stream. Keys are copied.
func streamRequests(chunks [][]byte, maxKey int) []reqResult {
	var pending []byte
	var out []reqResult
	for _, c := range chunks {
		pending = append(pending, c...)
		for {
			var r Request
			n, err := ParseRequest(pending, maxKey, &r)
			if err == ErrIncomplete {
				break
			}
			if r.Key != nil {
				r.Key = append([]byte{}, r.Key...)
			}
			out = append(out, reqResult{n, err, r})
			if err == ErrBadFrame {
				return out
			}
			pending = pending[n:]
		}
	}
	return out
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range requestSeeds() {
		f.Add(s, MaxKey)
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, buf []byte, maxKey int) {
		var r Request
		n, err := ParseRequest(buf, maxKey, &r)
		if n < 0 || n > len(buf) {
			t.Fatalf("n = %d outside 0..%d", n, len(buf))
		}
		switch err {
		case ErrIncomplete:
			if n != 0 {
				t.Fatalf("n = %d with ErrIncomplete", n)
			}
		case nil, ErrBadKey, ErrBadLease, ErrBadLimit:
			if n == 0 {
				t.Fatalf("n = 0 with %v", err)
			}
			// The frame was consumed whole: it re-encodes to the same bytes.
			if again := encodeRequest(t, nil, &r); !bytes.Equal(again, buf[:n]) {
				t.Fatalf("re-encoded %q, parsed %q", again, buf[:n])
			}
			if r.Key != nil && !within(r.Key, buf) {
				t.Fatalf("Key does not point into buf")
			}
			limit := maxKey
			if limit < 1 || limit > MaxKey {
				limit = MaxKey
			}
			keyOK := len(r.Key) >= 1 && len(r.Key) <= limit && utf8.Valid(r.Key)
			switch {
			case r.Op == OpHello:
				// The tail is taken whole, unjudged: any bytes but 0x0A.
				if err != nil || r.Key == nil || bytes.IndexByte(r.Key, '\n') >= 0 || len(r.Key) > MaxKey {
					t.Fatalf("hello: Key %q, err %v", r.Key, err)
				}
			case r.Op == OpPing:
				if r.Key != nil || err != nil {
					t.Fatalf("ping: Key %q, err %v", r.Key, err)
				}
			case err == ErrBadKey:
				if keyOK {
					t.Fatalf("ErrBadKey for key %q", r.Key)
				}
			case err == ErrBadLease:
				if !keyOK || r.Lease != 0 || !hasLease[r.Op] {
					t.Fatalf("ErrBadLease for %+v", r)
				}
			case err == ErrBadLimit:
				if !keyOK || r.Lease == 0 || r.Op != OpShared || r.Limit != 0 {
					t.Fatalf("ErrBadLimit for %+v", r)
				}
			default:
				if !keyOK || (hasLease[r.Op] && r.Lease == 0) || (r.Op == OpShared && r.Limit == 0) {
					t.Fatalf("accepted %+v", r)
				}
				if !hasLease[r.Op] && (r.Lease != 0 || r.Wait != 0) || r.Op != OpShared && r.Limit != 0 {
					t.Fatalf("fields the op does not carry: %+v", r)
				}
			}
		case ErrBadFrame:
			if n == 0 || r.Op != Op(buf[0]) {
				t.Fatalf("ErrBadFrame with n %d, Op %v", n, r.Op)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}

		// Half a buffer is incomplete or already gives the same answer.
		half := buf[:len(buf)/2]
		var r2 Request
		n2, err2 := ParseRequest(half, maxKey, &r2)
		if err2 != ErrIncomplete && (n2 != n || err2 != err || !sameRequest(&r2, &r)) {
			t.Fatalf("half: %d, %v, %+v; whole: %d, %v, %+v", n2, err2, r2, n, err, r)
		}
		if err == ErrIncomplete && err2 != ErrIncomplete {
			t.Fatalf("half decided (%v) what the whole could not", err2)
		}

		// Fed in two halves, a stream yields the same frames as fed whole.
		whole := streamRequests([][]byte{buf}, maxKey)
		split := streamRequests([][]byte{half, buf[len(half):]}, maxKey)
		if len(whole) != len(split) {
			t.Fatalf("whole: %d frames, split: %d", len(whole), len(split))
		}
		for i := range whole {
			a, b := whole[i], split[i]
			if a.n != b.n || a.err != b.err || !sameRequest(&a.r, &b.r) {
				t.Fatalf("frame %d: whole %+v, split %+v", i, a, b)
			}
		}
	})
}

type respResult struct {
	n   int
	err error
	r   Response
}

func streamResponses(chunks [][]byte) []respResult {
	var pending []byte
	var out []respResult
	for _, c := range chunks {
		pending = append(pending, c...)
		for {
			var r Response
			n, err := ParseResponse(pending, &r)
			if err == ErrIncomplete {
				break
			}
			if r.Tail != nil {
				r.Tail = append([]byte{}, r.Tail...)
			}
			out = append(out, respResult{n, err, r})
			if err == ErrBadFrame {
				return out
			}
			pending = pending[n:]
		}
	}
	return out
}

func FuzzParseResponse(f *testing.F) {
	for _, s := range responseSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, buf []byte) {
		var r Response
		n, err := ParseResponse(buf, &r)
		if n < 0 || n > len(buf) {
			t.Fatalf("n = %d outside 0..%d", n, len(buf))
		}
		switch err {
		case ErrIncomplete:
			if n != 0 {
				t.Fatalf("n = %d with ErrIncomplete", n)
			}
		case nil:
			if again := encodeResponse(t, nil, &r); !bytes.Equal(again, buf[:n]) {
				t.Fatalf("re-encoded %q, parsed %q", again, buf[:n])
			}
			if r.Tail != nil && !within(r.Tail, buf) {
				t.Fatalf("Tail does not point into buf")
			}
			if r.Op == OpPing && r.Tail != nil {
				t.Fatalf("pong with Tail %q", r.Tail)
			}
		case ErrBadFrame:
			if n == 0 || r.Op != Op(buf[0]) {
				t.Fatalf("ErrBadFrame with n %d, Op %v", n, r.Op)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}

		half := buf[:len(buf)/2]
		var r2 Response
		n2, err2 := ParseResponse(half, &r2)
		if err2 != ErrIncomplete && (n2 != n || err2 != err || !sameResponse(&r2, &r)) {
			t.Fatalf("half: %d, %v, %+v; whole: %d, %v, %+v", n2, err2, r2, n, err, r)
		}
		if err == ErrIncomplete && err2 != ErrIncomplete {
			t.Fatalf("half decided (%v) what the whole could not", err2)
		}

		whole := streamResponses([][]byte{buf})
		split := streamResponses([][]byte{half, buf[len(half):]})
		if len(whole) != len(split) {
			t.Fatalf("whole: %d frames, split: %d", len(whole), len(split))
		}
		for i := range whole {
			a, b := whole[i], split[i]
			if a.n != b.n || a.err != b.err || !sameResponse(&a.r, &b.r) {
				t.Fatalf("frame %d: whole %+v, split %+v", i, a, b)
			}
		}
	})
}
