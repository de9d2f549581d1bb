package fence_test

import (
	"fmt"

	"github.com/lockd-dev/lockd/fence"
)

// A protected store checks the holder's token before every write: a client
// that held the lock with token 41, paused past its lease, and came back
// after token 42 was granted to someone else is turned away.
func Example() {
	var store fence.Checker
	write := func(token uint64, v string) {
		if err := store.Check("accounts/7", token); err != nil {
			fmt.Println("rejected", v+":", err)
			return
		}
		fmt.Println("wrote", v)
	}
	write(41, "a") // first holder
	write(42, "b") // the next holder, after 41's lease ended
	write(41, "c") // the first holder wakes up late
	// Output:
	// wrote a
	// wrote b
	// rejected c: fence: stale token
}
