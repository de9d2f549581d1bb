package proto_test

import (
	"fmt"

	"github.com/lockd-dev/lockd/proto"
)

func ExampleParseRequest() {
	// An acquire (wait 5 s, lease 30 s, owner 42, key "orders/42"), followed
	// by the first bytes of a ping that has not fully arrived yet.
	buf := []byte("A\x05\x1e\x00\x00\x00\x00\x00\x00\x00\x2aorders/42\nP\x00\x00")
	var r proto.Request
	for {
		n, err := proto.ParseRequest(buf, proto.MaxKey, &r)
		if err == proto.ErrIncomplete {
			fmt.Printf("incomplete: keep %q, read more\n", buf)
			break
		}
		if err != nil {
			// ErrBadKey or ErrBadLease: answer E and go on after n bytes;
			// ErrBadFrame: answer E 1 and close.
			fmt.Println("error code", proto.Code(err))
			break
		}
		fmt.Printf("%v wait=%d lease=%d owner=%d key=%q (%d bytes)\n", r.Op, r.Wait, r.Lease, r.ID, r.Key, n)
		buf = buf[n:]
	}
	// Output:
	// acquire wait=5 lease=30 owner=42 key="orders/42" (21 bytes)
	// incomplete: keep "P\x00\x00", read more
}

func ExampleAppendAcquire() {
	buf := proto.AppendAcquire(nil, 5, 30, 42, "orders/42")
	fmt.Printf("%q\n", buf)
	// Output: "A\x05\x1e\x00\x00\x00\x00\x00\x00\x00*orders/42\n"
}

func ExampleAppendError() {
	// An answer to a renew with lease 0; a 0x0A in the message becomes a space.
	buf := proto.AppendError(nil, proto.OpRenew, 1000, proto.CodeBadLease, "bad lease:\nlease 0")
	var r proto.Response
	n, err := proto.ParseResponse(buf, &r)
	fmt.Printf("%q\n", buf)
	fmt.Println(n, err, r.Op, r.ReqOp, r.ID, r.Code, string(r.Tail))
	// Output:
	// "EK\x00\x00\x00\x00\x00\x00\x03\xe8\x03bad lease: lease 0\n"
	// 30 <nil> error renew 1000 3 bad lease: lease 0
}
