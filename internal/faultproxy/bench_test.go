package faultproxy

import (
	"io"
	"net"
	"testing"
)

// BenchmarkForward measures one connection's throughput client → target
// through a proxy with no fault (b.N chunks of 32 KiB), against the same
// transfer without the proxy.
func BenchmarkForward(b *testing.B) {
	for _, proxied := range []bool{false, true} {
		name := "direct"
		if proxied {
			name = "proxied"
		}
		b.Run(name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan int64, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- 0
					return
				}
				n, _ := io.Copy(io.Discard, c)
				c.Close()
				done <- n
			}()
			addr := ln.Addr().String()
			if proxied {
				p, err := New("127.0.0.1:0", addr)
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				addr = p.Addr()
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 32<<10)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			c.Close()
			if n := <-done; n != int64(b.N*len(buf)) {
				b.Fatalf("target read %d bytes, want %d", n, b.N*len(buf))
			}
		})
	}
}
