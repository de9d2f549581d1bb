package records

import (
	"errors"
	"fmt"
	"slices"

	"github.com/klauspost/compress/s2"
)

// Compression of what both modes replicate: s2 block encoding, chosen over
// zstd by measurement (BENCHMARKS.md, "The replication stream's
// compression").

// Codec says how a batch of records or a run of snapshot entries is
// encoded.
type Codec uint8

// Codecs.
const (
	CodecRaw Codec = 0 // the raw records or entries
	CodecS2  Codec = 1 // one s2 block (github.com/klauspost/compress/s2)
)

// String names the codec.
func (c Codec) String() string {
	switch c {
	case CodecRaw:
		return "raw"
	case CodecS2:
		return "s2"
	}
	return fmt.Sprintf("Codec(%d)", uint8(c))
}

// MaxRaw bounds the raw size Decompress produces (a member-link frame and
// a raft log entry are cut far below it).
const MaxRaw = 16 << 20

// compressMin is the smallest raw batch Compress tries to compress.
const compressMin = 256

// ErrBadCodec: an unknown codec, a raw length that raw data does not
// have, or one above the limit.
var ErrBadCodec = errors.New("records: unknown codec or impossible raw length")

// ErrCorrupt: compressed data that does not decode to its raw length.
var ErrCorrupt = errors.New("records: corrupt compressed data")

// Compress appends raw to dst encoded as it should travel: one s2 block
// (CodecS2) when raw is at least 256 bytes and the block is smaller than
// 7/8 of it, else raw itself (CodecRaw). It returns the codec and the
// extended dst. raw must be at most MaxRaw bytes.
func Compress(dst, raw []byte) (Codec, []byte) {
	if len(raw) >= compressMin {
		n := s2.MaxEncodedLen(len(raw))
		dst = slices.Grow(dst, n)
		enc := s2.Encode(dst[len(dst):len(dst)+n], raw)
		if len(enc)*8 < len(raw)*7 {
			return CodecS2, dst[:len(dst)+len(enc)]
		}
	}
	return CodecRaw, append(dst, raw...)
}

// Decompress returns the rawLen bytes that data encodes with codec c. Raw
// data is returned as it is; s2 data is decoded into dst's memory (from
// its start; a new buffer when dst is too small). rawLen is checked before
// anything is allocated: above MaxRaw, or not what the s2 block says, is
// an error, so a peer cannot make the caller allocate more than MaxRaw.
func Decompress(dst []byte, c Codec, data []byte, rawLen int) ([]byte, error) {
	return DecompressUpTo(dst, c, data, rawLen, MaxRaw)
}

// DecompressUpTo is Decompress with limit in place of MaxRaw (a shard of a
// raft snapshot can be larger than a batch).
func DecompressUpTo(dst []byte, c Codec, data []byte, rawLen, limit int) ([]byte, error) {
	switch {
	case c == CodecRaw && len(data) == rawLen:
		return data, nil
	case c != CodecS2 || rawLen < 0 || rawLen > limit:
		return nil, ErrBadCodec
	}
	if n, err := s2.DecodedLen(data); err != nil || n != rawLen {
		return nil, ErrCorrupt
	}
	if cap(dst) < rawLen {
		dst = make([]byte, rawLen)
	}
	out, err := s2.Decode(dst[:rawLen], data)
	if err != nil {
		return nil, ErrCorrupt
	}
	return out, nil
}
