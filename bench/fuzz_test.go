package main

import (
	"bytes"
	"testing"
)

// FuzzRespReply: the RESP reply parser never panics, never claims more bytes
// than it was given, and a prefix of a reply is either incomplete or parses
// the same way (it may not decide differently on less input).
func FuzzRespReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "-ERR x\r\n", ":1\r\n", ":0\r\n", "$3\r\nabc\r\n", "$-1\r\n",
		"$9223372036854775807\r\n", "$x\r\n", "\r\n", "+O", "$3\r\nab"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		typ, line, n, err := respReply(in)
		if err != nil {
			return
		}
		if n <= 0 || n > len(in) {
			t.Fatalf("n = %d for %d bytes", n, len(in))
		}
		if typ != in[0] {
			t.Fatalf("type %q, first byte %q", typ, in[0])
		}
		if typ != '$' && !bytes.Equal(line, in[1:n-2]) {
			t.Fatalf("line %q, frame %q", line, in[:n])
		}
		for cut := 0; cut < n; cut++ {
			if _, _, m, perr := respReply(in[:cut]); perr == nil && m != n {
				t.Fatalf("prefix of %d bytes parsed as %d bytes, whole as %d", cut, m, n)
			}
		}
	})
}
