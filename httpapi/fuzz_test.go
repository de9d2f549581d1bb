package httpapi

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/proto"
)

// parseCodes are the error codes parse may answer with: what the wire cannot
// carry, and a body that is no request.
var parseCodes = map[string]bool{CodeBadRequest: true, CodeBadKey: true, CodeBadLease: true, CodeBadWait: true,
	CodeBadToken: true, CodeBadLimit: true}

// FuzzParse: whatever the body of a POST route, parse either refuses it
// with a 400 and a code of the contract — before anything reaches the
// engine — or gives a request whose frame the engine's parser reads back
// whole, with the key byte for byte, the token, the lease rounded up and
// the limit; never a bad frame (E 1, which would close the connection).
// What the engine judges itself (an empty key, lease 0, limit 0) parses
// as the E it answers; a key is always UTF-8 (the body is), as the wire
// requires.
func FuzzParse(f *testing.F) {
	for _, s := range []struct {
		route int
		body  string
	}{
		{routeAcquire, `{"key":"jobs/nightly","wait_ms":10000,"lease_ms":60000}`},
		{routeAcquire, `{"key":"sem","lease_ms":8500,"limit":3}`},
		{routeAcquire, `{"key":"","lease_ms":0,"limit":0}`},
		{routeAcquire, `{"key":"a\u0000b é/\t","lease_ms":1,"wait_ms":255000}`},
		{routeRelease, `{"key":"k","token":"18446744073709551615"}`},
		{routeRenew, `{"key":"k","token":"1","lease_ms":255000}`},
		{routeValidate, `{"key":"k","token":"007"}`},
		{routeInspect, `{"key":"k","extra":[1,{"a":null}]}`},
		{routeRelease, `{"key":"k","token":12}`},
		{routeAcquire, `{"key":"k","lease_ms":1e3}`},
	} {
		f.Add(uint8(s.route), []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		c := &call{f: &Front{}, route: int(route) % (routeInspect + 1), start: time.Now()}
		q, err := c.parse(body)
		if err != nil {
			var br *badRequest
			if !errors.As(err, &br) || br.status != http.StatusBadRequest || !parseCodes[br.code] || br.msg == "" {
				t.Fatalf("refused with %#v (%v)", br, err)
			}
			return
		}
		fr := q.frame(nil, c.start)
		var r proto.Request
		n, err := proto.ParseRequest(fr, proto.MaxKey, &r)
		switch {
		case errors.Is(err, proto.ErrBadKey) && len(q.key) == 0:
		case errors.Is(err, proto.ErrBadLease) && q.lease == 0:
		case errors.Is(err, proto.ErrBadLimit) && q.limit == 0:
		case err != nil:
			t.Fatalf("%s: the frame %q does not parse: %v", body, fr, err)
		}
		if n != len(fr) || r.Op != q.op || string(r.Key) != q.key || r.ID != q.id {
			t.Fatalf("%s: the frame %q reads back as %+v (%d bytes)", body, fr, r, n)
		}
		if q.op == proto.OpAcquire || q.op == proto.OpShared || q.op == proto.OpRenew {
			if r.Lease != q.lease {
				t.Fatalf("%s: lease %d, want %d", body, r.Lease, q.lease)
			}
		}
		if q.op == proto.OpShared && r.Limit != q.limit {
			t.Fatalf("%s: limit %d, want %d", body, r.Limit, q.limit)
		}
	})
}
