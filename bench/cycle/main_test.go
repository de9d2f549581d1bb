//go:build linux

package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/lockdtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, lockdtest.LeakOptions...) }

// TestCycleAgainstLockd: against a real server every hop is a handoff
// between the two connections, the grant reaches the waiter's socket after
// the release that caused it was written and before the waiter reads it,
// and the report has a line per step.
func TestCycleAgainstLockd(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(map[int]string{1: "loops=1", 2: "loops=2"}[loops], func(t *testing.T) {
			srv := lockdtest.Start(t, func(c *engine.Config) { c.Loops = loops })
			cfg := config{addr: srv.Addr(), key: "cycle/test", hops: 300, warm: 20, timeout: 30 * time.Second}
			hs, err := measure(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(hs) < cfg.hops+cfg.warm {
				t.Fatalf("%d hops, want at least %d", len(hs), cfg.hops+cfg.warm)
			}
			for i := 1; i < len(hs); i++ {
				prev, h := hs[i-1], hs[i]
				if h.conn == prev.conn {
					t.Fatalf("hop %d: two grants in a row to connection %d", i, h.conn)
				}
				if h.rx < prev.send || h.read < h.rx || h.send < h.read || h.sent < h.send {
					t.Fatalf("hop %d out of order: release sent %d, grant rx %d read %d, next release %d..%d",
						i, prev.send, h.rx, h.read, h.send, h.sent)
				}
			}
			p := split(hs)
			if p.skipped != 0 || len(p.cycle) != len(hs)-1 {
				t.Fatalf("split: %d skipped, %d cycles of %d hops", p.skipped, len(p.cycle), len(hs))
			}
			for i := range p.cycle {
				if sum := p.server[i] + p.wake[i] + p.work[i]; sum != p.cycle[i] {
					t.Fatalf("hop %d: parts add up to %d, the cycle is %d", i, sum, p.cycle[i])
				}
			}
			var out bytes.Buffer
			report(&out, cfg, p)
			for _, want := range []string{"server: release written", "(wake-up)", "(parse, encode)", "cycle: one release", "write(2)"} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("report without %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// TestCycleFlags: bad flags are refused, naming the flag.
func TestCycleFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "-addr"},
		{[]string{"-addr", "127.0.0.1:1", "-hops", "0"}, "-hops"},
		{[]string{"-addr", "127.0.0.1:1", "-warm", "-1"}, "-warm"},
		{[]string{"-addr", "127.0.0.1:1", "-key", ""}, "-key"},
		{[]string{"-addr", "127.0.0.1:1", "-timeout", "0s"}, "-timeout"},
	} {
		err := run(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q): %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
