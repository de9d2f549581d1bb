package lockdtest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockd-dev/lockd/engine"
	"github.com/lockd-dev/lockd/internal/wait"
	"github.com/lockd-dev/lockd/proto"
)

// LeakOptions are the goroutines goleak must ignore in a process that ran
// a gnet server: gnet's goroutine pool starts workers at init and keeps
// them.
var LeakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
	goleak.IgnoreAnyFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1"),
}

// Config returns a test server's configuration: 127.0.0.1 on a free port,
// dataDir, 2 event loops (LOCKD_BENCH_LOOPS overrides, for benchmarks on a
// box whose cores the load generator shares), logs discarded (warnings
// shown under -v).
func Config(dataDir string) engine.Config {
	cfg := engine.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = dataDir
	cfg.Loops = 2
	if l, _ := strconv.Atoi(os.Getenv("LOCKD_BENCH_LOOPS")); l > 0 {
		cfg.Loops = l
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return cfg
}

// Serve starts a server from cfg and returns once it accepts connections.
func Serve(cfg engine.Config) (*engine.Server, error) {
	srv, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve() }()
	select {
	case <-srv.Ready():
		return srv, nil
	case err := <-errc:
		return nil, fmt.Errorf("serve: %w", err)
	case <-time.After(10 * time.Second):
		_ = srv.Close()
		return nil, errors.New("server not ready in 10 s")
	}
}

// Start serves Config(tb.TempDir()) as changed by mod (if not nil) and
// closes the server when the test ends, unless it already stopped.
func Start(tb testing.TB, mod func(*engine.Config)) *engine.Server {
	tb.Helper()
	cfg := Config(tb.TempDir())
	if mod != nil {
		mod(&cfg)
	}
	return StartWith(tb, cfg)
}

// StartWith serves cfg (a restart on the same data dir, say) and closes the
// server when the test ends, unless it already stopped.
func StartWith(tb testing.TB, cfg engine.Config) *engine.Server {
	tb.Helper()
	srv, err := Serve(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		select {
		case <-srv.Done():
		default:
			_ = srv.Close()
		}
	})
	return srv
}

// Keys returns n distinct keys of about 16 bytes.
func Keys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "bench/key/" + strconv.Itoa(i)
	}
	return keys
}

// Result is what Pipelined measured.
type Result struct {
	PairsPerSec float64
	// Latencies are acquire round trips (request written → answer read),
	// one in 16 sampled, sorted.
	Latencies []time.Duration
}

// Quantile returns the q-quantile of the sampled latencies (0 if none).
func (r Result) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	return r.Latencies[int(q*float64(len(r.Latencies)-1))]
}

// Pipelined is the raw load generator: conns connections to addr, each
// keeping depth acquires (of random keys, with wait and a 30 s lease) in
// flight and answering every grant with the release of its token at once,
// until n pairs are done in all. Connections are dialled before the clock
// starts.
func Pipelined(addr string, keys []string, conns, depth, n int, wait uint8) (Result, error) {
	ncs := make([]net.Conn, 0, conns)
	defer func() {
		for _, nc := range ncs {
			nc.Close()
		}
	}()
	for range conns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			return Result{}, err
		}
		ncs = append(ncs, nc)
	}
	per := n/conns + 1
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		res  Result
		errs []error
	)
	start := time.Now()
	for i, nc := range ncs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lats, err := pairs(nc, keys, per, depth, wait, uint64(i))
			mu.Lock()
			res.Latencies = append(res.Latencies, lats...)
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.PairsPerSec = float64(per*conns) / time.Since(start).Seconds()
	slices.Sort(res.Latencies)
	return res, errors.Join(errs...)
}

// pairs drives one connection for n pairs.
func pairs(nc net.Conn, keys []string, n, depth int, wait uint8, seed uint64) ([]time.Duration, error) {
	rng := rand.New(rand.NewPCG(seed, 7))
	sent := make(map[uint64]time.Time, depth)
	var (
		out, in  []byte
		owner    uint64
		lats     []time.Duration
		resp     proto.Response
		inflight int
		done     int
		issued   int
	)
	buf := make([]byte, 64<<10)
	for done < n {
		out = out[:0]
		for inflight < depth && issued < n {
			owner++
			out = proto.AppendAcquire(out, wait, 30, owner, keys[rng.IntN(len(keys))])
			if owner%16 == 0 {
				sent[owner] = time.Now()
			}
			inflight++
			issued++
		}
		if len(out) > 0 {
			if _, err := nc.Write(out); err != nil {
				return lats, err
			}
		}
		m, err := nc.Read(buf)
		if err != nil {
			return lats, err
		}
		in = append(in, buf[:m]...)
		out = out[:0]
		for {
			k, err := proto.ParseResponse(in, &resp)
			if err != nil {
				break
			}
			if t0, ok := sent[resp.ID]; ok && resp.Op != proto.OpRelease && resp.Op != proto.OpNotHeld {
				lats = append(lats, time.Since(t0))
				delete(sent, resp.ID)
			}
			switch resp.Op {
			case proto.OpAcquire:
				// The acquire's slot now carries its release.
				out = proto.AppendRelease(out, resp.Token, resp.Tail)
			case proto.OpTimeout, proto.OpBusy, proto.OpRelease, proto.OpNotHeld:
				inflight--
				done++
			}
			in = in[k:]
		}
		in = append(in[:0], in...)
		if len(out) > 0 {
			if _, err := nc.Write(out); err != nil {
				return lats, err
			}
		}
	}
	return lats, nil
}

// WaitFor is wait.For, for the engine's tests that call it by this name
// (the other packages' tests call wait.For).
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	wait.For(tb, what, cond)
}
