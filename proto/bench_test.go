package proto

import "testing"

func BenchmarkParseRequest(b *testing.B) {
	in := []byte(rawAcquire(5, 30, 0x1122334455667788, k16))
	var r Request
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRequest(in, MaxKey, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParsePipelined parses a buffer of 1000 request frames, as a
// server does with one read from a pipelining client, and reports ns/frame:
// typical ones (valid, ASCII keys of 8 to 40 bytes) and mixed ones (keys
// with multi-byte runes and control bytes, some E 2 and E 3 frames).
func BenchmarkParsePipelined(b *testing.B) {
	b.Run("typical", func(b *testing.B) { benchPipelined(b, pipelineRequests(1000, 3, true)) })
	b.Run("mixed", func(b *testing.B) { benchPipelined(b, pipelineRequests(1000, 3, false)) })
}

func benchPipelined(b *testing.B, p pipelined) {
	var r Request
	b.SetBytes(int64(len(p.in)))
	b.ReportAllocs()
	frames := 0
	for b.Loop() {
		for off := 0; off < len(p.in); frames++ {
			n, err := ParseRequest(p.in[off:], MaxKey, &r)
			if err == ErrBadFrame || err == ErrIncomplete {
				b.Fatal(err)
			}
			off += n
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(frames), "ns/frame")
}

func BenchmarkParseResponse(b *testing.B) {
	in := []byte(rawAcquired(0x1122334455667788, 1<<50, k16))
	var r Response
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseResponse(in, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendAcquire(b *testing.B) {
	dst := make([]byte, 0, 64)
	b.SetBytes(int64(len(rawAcquire(5, 30, 1, k16))))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendAcquire(dst[:0], 5, 30, 0x1122334455667788, k16)
	}
}

func BenchmarkAppendAcquired(b *testing.B) {
	key := []byte(k16)
	dst := make([]byte, 0, 64)
	b.SetBytes(int64(len(rawAcquired(1, 1, k16))))
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendAcquired(dst[:0], 0x1122334455667788, 1<<50, key)
	}
}

func BenchmarkAppendError(b *testing.B) {
	dst := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendError(dst[:0], OpAcquire, 0x1122334455667788, CodeBadKey, "proto: bad key")
	}
}
