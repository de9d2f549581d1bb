package engine_test

import (
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/proto"
)

// TestACLClientCertificate: with --acl and mutual TLS, a connection whose
// verified client certificate names an identity of the file is
// authenticated at once, without a hello (PROTOCOL.md §8.3), for a `cert`
// identity and for one with a secret alike; a certificate whose Common Name
// is not in the file authenticates nothing (E 5, close); a hello on a
// certificate connection can still switch it to another identity; a `cert`
// identity cannot say hello (E 5).
func TestACLClientCertificate(t *testing.T) {
	p := newPKI(t)
	certonly, err := p.ca.Issue("certonly")
	if err != nil {
		t.Fatal(err)
	}
	orders, err := p.ca.Issue("orders")
	if err != nil {
		t.Fatal(err)
	}
	ts := startTLSServer(t, p, true, func(c *engine.Config) { c.ACL = parseACL(t, aclText) })

	// A cert identity: serves at once, on its keys (*).
	c := dialTLS(t, ts.Addr(), p.clientTLS(certonly))
	tok := c.grant("anything/1", 30, 1)
	c.release("anything/1", tok)
	c.expect(proto.OpRelease, tok)

	// An identity with a secret, by certificate: its own keys only.
	o := dialTLS(t, ts.Addr(), p.clientTLS(orders))
	o.grant("orders/1", 30, 2)
	o.acquire("billing/1", 0, 30, 3)
	o.expectE(proto.OpAcquire, 3, proto.CodePermissionDenied)
	// A hello switches it to billing, whose keys are billing/.
	o.login("billing")
	o.grant("billing/1", 30, 4)
	o.acquire("orders/2", 0, 30, 5)
	o.expectE(proto.OpAcquire, 5, proto.CodePermissionDenied)

	// A certificate whose CN (alice) is not an identity: unauthenticated.
	a := dialTLS(t, ts.Addr(), p.clientTLS(p.alice))
	a.send(proto.AppendPing(nil, 6))
	a.expect(proto.OpPing, 6) // a ping needs no identity
	a.acquire("orders/3", 0, 30, 7)
	a.expectE(proto.OpAcquire, 7, proto.CodeUnauthenticated)
	a.closed(5 * time.Second)

	// A cert identity cannot authenticate by hello, even over TLS.
	h := dialTLS(t, ts.Addr(), p.clientTLS(p.alice))
	if f := h.hello(8, "certonly whatever"); f.Op != proto.OpError || f.Code != proto.CodeUnauthenticated {
		t.Fatalf("hello as a cert identity: %+v", f)
	}
	h.closed(5 * time.Second)
}
