package fence_test

import (
	"fmt"

	"github.com/lockd-dev/lockd/fence"
)

// A protected store checks the holder's token and writes in one step: a
// client that held the lock with token 41, paused past its lease, and came
// back after token 42 was granted to someone else is turned away.
func Example() {
	var store fence.Checker
	write := func(token uint64, v string) {
		err := store.Do("accounts/7", token, func() error {
			fmt.Println("wrote", v) // the resource's write, under the check
			return nil
		})
		if err != nil {
			fmt.Println("rejected", v+":", err)
		}
	}
	write(41, "a") // first holder
	write(42, "b") // the next holder, after 41's lease ended
	write(41, "c") // the first holder wakes up late
	// Output:
	// wrote a
	// wrote b
	// rejected c: fence: stale token
}
