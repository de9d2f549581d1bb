package fence_test

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// A resource that asks lockd before acting, and also keeps the largest
// token it has seen. In a real program V is the lockd client
// (*client.Client); here a function stands in for lockd, which holds
// token 42 with 20 s of lease left.
func ExampleValidating() {
	lockd := fence.ValidatorFunc(func(_ context.Context, key string, token uint64) (time.Duration, error) {
		if key == "accounts/7" && token == 42 {
			return 20 * time.Second, nil
		}
		return 0, errors.New("lock not held")
	})
	check := &fence.Validating{V: lockd, MinRemaining: time.Second}
	var seen fence.Checker
	write := func(token uint64) {
		err := check.Do(context.Background(), "accounts/7", token, func(ctx context.Context) error {
			// ctx ends when the lease could end; the write stops by then.
			return seen.Do("accounts/7", token, func() error {
				fmt.Println("wrote with token", token)
				return nil
			})
		})
		if err != nil {
			fmt.Println("rejected:", err)
		}
	}
	write(42) // the current holder
	write(41) // a holder whose grant ended, before anyone newer wrote
	// Output:
	// wrote with token 42
	// rejected: fence: token 41 of "accounts/7" not confirmed by the lock service: lock not held
}
