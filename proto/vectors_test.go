package proto

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// The shared wire vectors in testdata/vectors.json (§1–§8) and
// testdata/vectors9.json (§9): the Python client's tests
// (clients/python/tests/test_vectors.py) read the same files, so the codecs
// cannot drift. Every valid frame must parse to exactly its fields and
// encode back to exactly its bytes; every bad one must get the same
// verdict. The coverage checks (a vector for every op and code) hold over
// both files together.

type vectorFile struct {
	Requests            []requestVector     `json:"requests"`
	BadRequests         []badRequestVector  `json:"bad_requests"`
	IncompleteRequests  []string            `json:"incomplete_requests"`
	Responses           []responseVector    `json:"responses"`
	BadResponses        []badResponseVector `json:"bad_responses"`
	IncompleteResponses []string            `json:"incomplete_responses"`
}

type requestVector struct {
	Name  string `json:"name"`
	Hex   string `json:"hex"`
	Op    string `json:"op"`
	Wait  uint8  `json:"wait"`
	Lease uint8  `json:"lease"`
	Limit uint16 `json:"limit"`
	ID    uint64 `json:"id"`
	Key   string `json:"key"`
}

type badRequestVector struct {
	Name   string `json:"name"`
	Hex    string `json:"hex"`
	Code   uint8  `json:"code"`
	Op     string `json:"op"`
	ID     uint64 `json:"id"`
	MaxKey int    `json:"max_key"`
}

type responseVector struct {
	Name      string `json:"name"`
	Hex       string `json:"hex"`
	Op        string `json:"op"`
	ReqOp     string `json:"req_op"`
	ID        uint64 `json:"id"`
	Token     uint64 `json:"token"`
	Code      uint8  `json:"code"`
	Reason    uint8  `json:"reason"`
	Remaining uint32 `json:"remaining"`
	Holders   uint16 `json:"holders"`
	Limit     uint16 `json:"limit"`
	Waiters   uint32 `json:"waiters"`
	Tail      string `json:"tail"`
}

type badResponseVector struct {
	Name string `json:"name"`
	Hex  string `json:"hex"`
	Op   string `json:"op"`
	ID   uint64 `json:"id"`
}

// vectorFiles are the vector files, §1–§8 and §9.
var vectorFiles = []string{"testdata/vectors.json", "testdata/vectors9.json"}

func loadVectors(t *testing.T, path string) *vectorFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(v.Requests) == 0 || len(v.Responses) == 0 || len(v.BadRequests) == 0 || len(v.BadResponses) == 0 ||
		len(v.IncompleteRequests) == 0 || len(v.IncompleteResponses) == 0 {
		t.Fatalf("%s: a section is empty", path)
	}
	return &v
}

// eachVectorFile runs fn on every vector file, in a subtest named after it.
func eachVectorFile(t *testing.T, fn func(t *testing.T, v *vectorFile)) {
	for _, path := range vectorFiles {
		v := loadVectors(t, path)
		t.Run(strings.TrimSuffix(path[len("testdata/"):], ".json"), func(t *testing.T) { fn(t, v) })
	}
}

func vectorBytes(t *testing.T, name, h string) []byte {
	t.Helper()
	b, err := hex.DecodeString(h)
	if err != nil {
		t.Fatalf("%s: hex: %v", name, err)
	}
	return b
}

// vectorOp is the op byte a vector names as a one-character string.
func vectorOp(t *testing.T, name, s string) Op {
	t.Helper()
	if len(s) != 1 {
		t.Fatalf("%s: op %q is not one byte", name, s)
	}
	return Op(s[0])
}

func TestVectorRequests(t *testing.T) {
	ops := map[Op]bool{}
	eachVectorFile(t, func(t *testing.T, v *vectorFile) { vectorRequests(t, v, ops) })
	for _, op := range RequestOps {
		if !ops[op] {
			t.Errorf("no vector for request op %v", op)
		}
	}
}

func vectorRequests(t *testing.T, v *vectorFile, ops map[Op]bool) {
	for _, c := range v.Requests {
		t.Run(c.Name, func(t *testing.T) {
			in := vectorBytes(t, c.Name, c.Hex)
			want := Request{Op: vectorOp(t, c.Name, c.Op), Wait: c.Wait, Lease: c.Lease, Limit: c.Limit, ID: c.ID}
			if want.Op != OpPing {
				want.Key = []byte(c.Key)
			}
			ops[want.Op] = true
			var r Request
			n, err := ParseRequest(in, MaxKey, &r)
			if err != nil || n != len(in) {
				t.Fatalf("ParseRequest = %d, %v; want %d, nil", n, err, len(in))
			}
			if !sameRequest(&r, &want) {
				t.Fatalf("ParseRequest = %+v, want %+v", r, want)
			}
			var out []byte
			switch want.Op {
			case OpAcquire:
				out = AppendAcquire(nil, c.Wait, c.Lease, c.ID, c.Key)
			case OpRelease:
				out = AppendRelease(nil, c.ID, c.Key)
			case OpRenew:
				out = AppendRenew(nil, c.Lease, c.ID, c.Key)
			case OpPing:
				out = AppendPing(nil, c.ID)
			case OpHello:
				identity, secret, ok := strings.Cut(c.Key, " ")
				if !ok {
					return // AppendHello always writes the 0x20; this tail has none
				}
				out = AppendHello(nil, c.ID, identity, secret)
			case OpShared:
				out = AppendShared(nil, c.Wait, c.Lease, c.ID, c.Limit, c.Key)
			case OpValidate:
				out = AppendValidate(nil, c.ID, c.Key)
			case OpWatch:
				out = AppendWatch(nil, c.ID, c.Key)
			case OpInspect:
				out = AppendInspect(nil, c.ID, c.Key)
			default:
				t.Fatalf("no encoder for request op %v", want.Op)
			}
			if !bytes.Equal(out, in) {
				t.Fatalf("encoded %x, want %x", out, in)
			}
		})
	}
}

func TestVectorBadRequests(t *testing.T) {
	codes := map[uint8]bool{}
	eachVectorFile(t, func(t *testing.T, v *vectorFile) { vectorBadRequests(t, v, codes) })
	for _, code := range []uint8{CodeBadFrame, CodeBadKey, CodeBadLease, CodeLimitMismatch} {
		if !codes[code] {
			t.Errorf("no bad-request vector for code %d", code)
		}
	}
}

func vectorBadRequests(t *testing.T, v *vectorFile, codes map[uint8]bool) {
	for _, c := range v.BadRequests {
		t.Run(c.Name, func(t *testing.T) {
			in := vectorBytes(t, c.Name, c.Hex)
			maxKey := c.MaxKey
			if maxKey == 0 {
				maxKey = MaxKey
			}
			codes[c.Code] = true
			var r Request
			n, err := ParseRequest(in, maxKey, &r)
			if got := Code(err); got != c.Code {
				t.Fatalf("ParseRequest error %v (code %d), want code %d", err, got, c.Code)
			}
			if r.Op != vectorOp(t, c.Name, c.Op) || r.ID != c.ID {
				t.Fatalf("op %v id %d, want %q %d", r.Op, r.ID, c.Op, c.ID)
			}
			if c.Code != CodeBadFrame && n != len(in) {
				t.Fatalf("consumed %d bytes, want the whole frame (%d)", n, len(in))
			}
		})
	}
	for _, h := range v.IncompleteRequests {
		in := vectorBytes(t, "incomplete", h)
		var r Request
		if n, err := ParseRequest(in, MaxKey, &r); err != ErrIncomplete || n != 0 {
			t.Errorf("ParseRequest(%x) = %d, %v; want 0, ErrIncomplete", in, n, err)
		}
	}
}

func TestVectorResponses(t *testing.T) {
	ops := map[Op]bool{}
	codes := map[uint8]bool{}
	eachVectorFile(t, func(t *testing.T, v *vectorFile) { vectorResponses(t, v, ops, codes) })
	for o := range 256 {
		if op := Op(o); op.IsResponse() && !ops[op] {
			t.Errorf("no vector for response op %v", op)
		}
	}
	for code := CodeBadFrame; code <= MaxCode; code++ {
		if !codes[code] {
			t.Errorf("no E vector for code %d", code)
		}
	}
}

func vectorResponses(t *testing.T, v *vectorFile, ops map[Op]bool, codes map[uint8]bool) {
	for _, c := range v.Responses {
		t.Run(c.Name, func(t *testing.T) {
			in := vectorBytes(t, c.Name, c.Hex)
			want := Response{Op: vectorOp(t, c.Name, c.Op), ID: c.ID, Token: c.Token, Code: c.Code, Reason: c.Reason,
				Remaining: c.Remaining, Holders: c.Holders, Limit: c.Limit, Waiters: c.Waiters}
			if c.ReqOp != "" {
				want.ReqOp = vectorOp(t, c.Name, c.ReqOp)
			}
			if want.Op != OpPing {
				want.Tail = []byte(c.Tail)
			}
			ops[want.Op] = true
			if want.Op == OpError {
				codes[want.Code] = true
			}
			var r Response
			n, err := ParseResponse(in, &r)
			if err != nil || n != len(in) {
				t.Fatalf("ParseResponse = %d, %v; want %d, nil", n, err, len(in))
			}
			if !sameResponse(&r, &want) {
				t.Fatalf("ParseResponse = %+v, want %+v", r, want)
			}
			var out []byte
			switch want.Op {
			case OpAcquire:
				out = AppendAcquired(nil, c.ID, c.Token, c.Tail)
			case OpTimeout:
				out = AppendTimeout(nil, c.ID, c.Tail)
			case OpBusy:
				out = AppendBusy(nil, c.ID, c.Tail)
			case OpRelease:
				out = AppendReleased(nil, c.ID, c.Tail)
			case OpRenew:
				out = AppendRenewed(nil, c.ID, c.Tail)
			case OpNotHeld:
				out = AppendNotHeld(nil, want.ReqOp, c.ID, c.Tail)
			case OpPing:
				out = AppendPong(nil, c.ID)
			case OpMoved:
				out = AppendMoved(nil, want.ReqOp, c.ID, c.Tail)
			case OpError:
				out = AppendError(nil, want.ReqOp, c.ID, c.Code, c.Tail)
			case OpHello:
				out = AppendWelcome(nil, c.ID, c.Tail)
			case OpValidate:
				out = AppendValid(nil, c.ID, c.Remaining, c.Tail)
			case OpWatch:
				out = AppendWatching(nil, c.ID, c.Tail)
			case OpLost:
				out = AppendLost(nil, c.ID, c.Reason, c.Tail)
			case OpInspect:
				out = AppendInspection(nil, c.ID, c.Holders, c.Limit, c.Waiters, c.Token, c.Remaining, c.Tail)
			default:
				t.Fatalf("no encoder for response op %v", want.Op)
			}
			if !bytes.Equal(out, in) {
				t.Fatalf("encoded %x, want %x", out, in)
			}
		})
	}
}

func TestVectorBadResponses(t *testing.T) { eachVectorFile(t, vectorBadResponses) }

func vectorBadResponses(t *testing.T, v *vectorFile) {
	for _, c := range v.BadResponses {
		t.Run(c.Name, func(t *testing.T) {
			in := vectorBytes(t, c.Name, c.Hex)
			var r Response
			_, err := ParseResponse(in, &r)
			if err != ErrBadFrame {
				t.Fatalf("ParseResponse error %v, want ErrBadFrame", err)
			}
			if r.Op != vectorOp(t, c.Name, c.Op) || r.ID != c.ID {
				t.Fatalf("op %v id %d, want %q %d", r.Op, r.ID, c.Op, c.ID)
			}
		})
	}
	for _, h := range v.IncompleteResponses {
		in := vectorBytes(t, "incomplete", h)
		var r Response
		if n, err := ParseResponse(in, &r); err != ErrIncomplete || n != 0 {
			t.Errorf("ParseResponse(%x) = %d, %v; want 0, ErrIncomplete", in, n, err)
		}
	}
}

// TestVectorStream parses every valid frame of each direction from one
// buffer, cut in two at every offset, as a connection reads them.
func TestVectorStream(t *testing.T) { eachVectorFile(t, vectorStream) }

func vectorStream(t *testing.T, v *vectorFile) {
	var reqs, resps []byte
	for _, c := range v.Requests {
		reqs = append(reqs, vectorBytes(t, c.Name, c.Hex)...)
	}
	for _, c := range v.Responses {
		resps = append(resps, vectorBytes(t, c.Name, c.Hex)...)
	}
	for cut := 0; cut <= len(reqs); cut++ {
		got := streamRequests([][]byte{reqs[:cut], reqs[cut:]}, MaxKey)
		if len(got) != len(v.Requests) {
			t.Fatalf("requests cut at %d: %d frames, want %d", cut, len(got), len(v.Requests))
		}
		for i, g := range got {
			if g.err != nil || g.r.ID != v.Requests[i].ID {
				t.Fatalf("requests cut at %d: frame %d: %v, id %d", cut, i, g.err, g.r.ID)
			}
		}
	}
	for cut := 0; cut <= len(resps); cut++ {
		got := streamResponses([][]byte{resps[:cut], resps[cut:]})
		if len(got) != len(v.Responses) {
			t.Fatalf("responses cut at %d: %d frames, want %d", cut, len(got), len(v.Responses))
		}
		for i, g := range got {
			if g.err != nil || g.r.ID != v.Responses[i].ID {
				t.Fatalf("responses cut at %d: frame %d: %v, id %d", cut, i, g.err, g.r.ID)
			}
		}
	}
}
