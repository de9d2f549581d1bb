package main

import (
	"strings"
	"testing"

	"github.com/lockd-dev/lockd/proto"
)

func TestLockdCodecRouting(t *testing.T) {
	c := newLockdCodec()
	s3 := &slot{local: 3}
	s5 := &slot{local: 5}
	out := c.encode(nil, s3, action{op: opAcquire, key: []byte("k"), wait: 5, lease: 10})
	var req proto.Request
	if _, err := proto.ParseRequest(out, proto.MaxKey, &req); err != nil || req.Op != proto.OpAcquire || req.Wait != 5 || req.Lease != 10 {
		t.Fatalf("acquire frame %q: %v %+v", out, err, req)
	}
	owner := req.ID
	var in []byte
	in = proto.AppendAcquired(in, owner, 77, "k")
	c.encode(nil, s5, action{op: opRelease, key: []byte("k"), token: 77})
	in = proto.AppendReleased(in, 77, "k")
	in = proto.AppendTimeout(in, owner, "k")
	in = proto.AppendError(in, proto.OpAcquire, owner, proto.CodeBadKey, "x")
	want := []answer{{ansGranted, 3, 77}, {ansReleased, 5, 0}, {ansRefused, 3, 0}, {ansError, 3, 0}}
	for i, w := range want {
		var a answer
		n, err := c.decode(in, &a)
		if err != nil || a != w {
			t.Fatalf("answer %d: %+v %v, want %+v", i, a, err, w)
		}
		in = in[n:]
	}
	if _, err := c.decode(in, &answer{}); err != errIncomplete {
		t.Fatalf("empty input: %v, want errIncomplete", err)
	}
}

func TestRespReply(t *testing.T) {
	for _, c := range []struct {
		in   string
		typ  byte
		line string
		n    int
		err  error
	}{
		{"+OK\r\n", '+', "OK", 5, nil},
		{"$-1\r\n", '$', "-1", 5, nil},
		{":1\r\n:0\r\n", ':', "1", 4, nil},
		{"$3\r\nabc\r\n", '$', "abc", 9, nil},
		{"$3\r\nab", 0, "", 0, errIncomplete},
		{"+O", 0, "", 0, errIncomplete},
		{"-ERR x\r\n", '-', "ERR x", 8, nil},
	} {
		typ, line, n, err := respReply([]byte(c.in))
		if typ != c.typ || string(line) != c.line || n != c.n || err != c.err {
			t.Errorf("%q: %q %q %d %v", c.in, typ, line, n, err)
		}
	}
	if _, _, _, err := respReply([]byte("$x\r\n")); err == nil || err == errIncomplete {
		t.Errorf("bad bulk length accepted: %v", err)
	}
}

func TestRedisCodecFIFO(t *testing.T) {
	c := newRedisCodec(9)
	s1, s2 := &slot{local: 1}, &slot{local: 2}
	out := c.encode(nil, s1, action{op: opAcquire, key: []byte("a"), lease: 3})
	out = c.encode(out, s2, action{op: opAcquire, key: []byte("a"), lease: 3})
	out = c.encode(out, s1, action{op: opRelease, key: []byte("a"), token: 5})
	out = c.encode(out, s2, action{op: opRenew, key: []byte("b"), token: 6, lease: 2})
	const set = "*6\r\n$3\r\nSET\r\n$1\r\na\r\n$11\r\n38654705665\r\n$2\r\nNX\r\n$2\r\nPX\r\n$4\r\n3000\r\n"
	if !strings.HasPrefix(string(out), set) {
		t.Fatalf("SET frame %q, want prefix %q", out, set)
	}
	in := []byte("+OK\r\n$-1\r\n:0\r\n:1\r\n")
	want := []ansKind{ansGranted, ansRefused, ansNotHeld, ansRenewed}
	slots := []int{1, 2, 1, 2}
	for i := range want {
		var a answer
		n, err := c.decode(in, &a)
		if err != nil || a.kind != want[i] || a.slot != slots[i] {
			t.Fatalf("reply %d: %+v %v", i, a, err)
		}
		if i == 0 && a.token != 9<<32|1 {
			t.Fatalf("grant token %d, want the value SET with", a.token)
		}
		in = in[n:]
	}
	if _, err := c.decode([]byte("+OK\r\n"), &answer{}); err == nil {
		t.Fatal("a reply without a request must be an error")
	}
}
