package fence

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// A Validator asks the lock service whether token is a current grant of
// key, and how long its lease has left. lockd's Go client
// (*client.Client, whose Validate sends PROTOCOL.md §9.3's V) satisfies
// it; a test may use a func of its own (ValidatorFunc).
//
// Validate returns nil and the lease time left when the grant is current,
// and an error otherwise: the lock service's "not held", or any failure
// to get its answer. A resource must not act on an error of either kind.
type Validator interface {
	Validate(ctx context.Context, key string, token uint64) (remaining time.Duration, err error)
}

// ValidatorFunc adapts a function to Validator.
type ValidatorFunc func(ctx context.Context, key string, token uint64) (time.Duration, error)

// Validate calls f.
func (f ValidatorFunc) Validate(ctx context.Context, key string, token uint64) (time.Duration, error) {
	return f(ctx, key, token)
}

// ErrNotValid rejects a token that the lock service did not confirm: it
// answered that the token is not a current grant of the key, or could not
// be asked (the error returned matches both ErrNotValid and the
// Validator's error, so errors.Is tells which), or the lease had less
// than Validating.MinRemaining left.
var ErrNotValid = errors.New("fence: token not confirmed by the lock service")

// notValid is ErrNotValid with the key, the token and the cause.
type notValid struct {
	key   string
	token uint64
	cause error // the Validator's error, nil when the lease was too short
	left  time.Duration
}

func (e *notValid) Error() string {
	if e.cause == nil {
		return fmt.Sprintf("fence: token %d of %q has %v of lease left, less than required", e.token, e.key, e.left)
	}
	return fmt.Sprintf("fence: token %d of %q not confirmed by the lock service: %v", e.token, e.key, e.cause)
}

func (e *notValid) Is(target error) bool { return target == ErrNotValid }

func (e *notValid) Unwrap() error { return e.cause }

// Validating is the resource-side check that asks the lock service
// (through its Validator, lockd's V) before each action whether the
// token it carries is a current grant: "is this holder still the
// holder?", not "has anyone newer acted?". It turns away a holder whose
// lease ended or that was released even when no newer holder has come
// yet, and it accepts every current holder of a shared key (a
// semaphore's permits, a read lock's readers), whose tokens Checker's
// rule would play off against each other.
//
// Between the answer and the action the lease keeps running: Do gives
// the action a context that ends when the lease could end (the instant
// the question was asked plus the time lockd said was left), and
// MinRemaining refuses tokens too close to their end for the action to
// finish. It costs the resource one round trip to lockd per action and
// makes lockd a dependency of the resource: when lockd cannot be
// reached, every action is refused. See the package comment for when to
// use which rule, or both.
//
// A Validating is safe for concurrent use once its fields are set.
type Validating struct {
	// V is the lock service: a *client.Client.
	V Validator
	// MinRemaining refuses a token whose lease has less than this left
	// (0: any time left).
	MinRemaining time.Duration
}

// Check asks the lock service whether token is a current grant of key
// with at least MinRemaining of its lease left, and returns the lease
// time left; otherwise an error matching ErrNotValid (and the
// Validator's error, when it gave one).
func (v *Validating) Check(ctx context.Context, key string, token uint64) (time.Duration, error) {
	left, err := v.V.Validate(ctx, key, token)
	if err != nil {
		return 0, &notValid{key: key, token: token, cause: err}
	}
	if left < v.MinRemaining {
		return left, &notValid{key: key, token: token, left: left}
	}
	return left, nil
}

// Do checks token as Check does and, if the lock service confirmed it,
// runs act with a context that ends when the lease could end: the
// instant the question was sent plus the time left that lockd answered
// (the lease may be renewed meanwhile, but nothing here knows). act
// should stop when that context ends. It returns Check's error (act not
// run) or act's.
func (v *Validating) Do(ctx context.Context, key string, token uint64, act func(ctx context.Context) error) error {
	asked := time.Now()
	left, err := v.Check(ctx, key, token)
	if err != nil {
		return err
	}
	actx, cancel := context.WithDeadline(ctx, asked.Add(left))
	defer cancel()
	return act(actx)
}
