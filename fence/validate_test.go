package fence

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errNotHeld = errors.New("lock not held") // what a Validator says for N

// grants is a lock service's view for the tests: token → lease left.
func grants(m map[uint64]time.Duration) ValidatorFunc {
	return func(ctx context.Context, key string, token uint64) (time.Duration, error) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if key != "k" {
			return 0, errNotHeld
		}
		left, ok := m[token]
		if !ok {
			return 0, errNotHeld
		}
		return left, nil
	}
}

func TestValidatingCheck(t *testing.T) {
	down := errors.New("no connection to lockd")
	svc := grants(map[uint64]time.Duration{5: 10 * time.Second, 6: 10 * time.Second, 7: 50 * time.Millisecond})
	cases := []struct {
		name   string
		v      Validator
		min    time.Duration
		key    string
		token  uint64
		cause  error // nil: accepted, or rejected for a short lease when short
		short  bool
		wantOK bool
	}{
		{name: "current", v: svc, key: "k", token: 6, wantOK: true},
		{name: "older current holder of a shared key", v: svc, key: "k", token: 5, wantOK: true},
		{name: "not held", v: svc, key: "k", token: 4, cause: errNotHeld},
		{name: "another key's", v: svc, key: "other", token: 6, cause: errNotHeld},
		{name: "lockd unreachable", v: ValidatorFunc(func(context.Context, string, uint64) (time.Duration, error) { return 0, down }), key: "k", token: 6, cause: down},
		{name: "too little lease left", v: svc, min: time.Second, key: "k", token: 7, short: true},
		{name: "enough lease left", v: svc, min: time.Second, key: "k", token: 6, wantOK: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := &Validating{V: c.v, MinRemaining: c.min}
			left, err := v.Check(context.Background(), c.key, c.token)
			if c.wantOK {
				if err != nil || left <= 0 {
					t.Fatalf("Check = %v, %v; want accepted with the lease left", left, err)
				}
				return
			}
			if !errors.Is(err, ErrNotValid) {
				t.Fatalf("Check = %v, want ErrNotValid", err)
			}
			if c.cause != nil && !errors.Is(err, c.cause) {
				t.Fatalf("Check = %v, want it to carry %v", err, c.cause)
			}
			if c.short && errors.Unwrap(err) != nil {
				t.Fatalf("Check = %v: a short lease has no cause of the Validator's", err)
			}
		})
	}
}

// TestValidatingDo: act runs only for a confirmed token, under a context
// that ends when the lease could end; a refusal or act's error is Do's.
func TestValidatingDo(t *testing.T) {
	v := &Validating{V: grants(map[uint64]time.Duration{9: 80 * time.Millisecond})}
	start := time.Now()
	err := v.Do(context.Background(), "k", 9, func(ctx context.Context) error {
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("act's context has no deadline")
		}
		if d := dl.Sub(start); d > 80*time.Millisecond+20*time.Millisecond || d < 70*time.Millisecond {
			t.Fatalf("act's deadline %v after the check began, want the 80ms lease left", d)
		}
		<-ctx.Done()
		return nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	ran := false
	err = v.Do(context.Background(), "k", 8, func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, ErrNotValid) || !errors.Is(err, errNotHeld) || ran {
		t.Fatalf("Do with a token not held: %v, act ran %v", err, ran)
	}
	failed := errors.New("disk full")
	if err := v.Do(context.Background(), "k", 9, func(context.Context) error { return failed }); err != failed {
		t.Fatalf("Do = %v, want act's error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := v.Do(ctx, "k", 9, func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("Do with a cancelled ctx: %v, act ran %v", err, ran)
	}
}
