package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/internal/testcerts"
	"github.com/lockd-dev/lockd/proto"
	"github.com/lockd-dev/lockd/tlsconf"
)

// The TLS targets: lockd-tls (the lockd child of the lockd target, its
// client port speaking TLS through tlsconf as the daemon's does) and
// redis-tls (redis-server with --tls-port, clients not asked for a
// certificate). Both use a throwaway CA and a certificate for 127.0.0.1,
// ECDSA P-256, and crypto/tls's defaults otherwise on the driver's side: a
// full handshake per connection (no session resumption), TLS 1.3.

// tlsDirEnv names the environment variable that hands the lockd-tls child
// the directory of its certificate files.
const tlsDirEnv = "LOCKD_BENCH_TLS_DIR"

// tlsMaterial is a directory holding a CA and a server certificate, and
// the driver's client configuration trusting that CA.
type tlsMaterial struct {
	dir, caFile, certFile, keyFile string
	client                         *tls.Config
}

// tlsFiles are the server's files in dir.
func tlsFiles(dir string) tlsconf.Files {
	return tlsconf.Files{Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem")}
}

func newTLSMaterial() (*tlsMaterial, error) {
	dir, err := os.MkdirTemp("", "bench-tls-")
	if err != nil {
		return nil, err
	}
	m := &tlsMaterial{dir: dir}
	err = func() error {
		ca, err := testcerts.NewCA("bench CA")
		if err != nil {
			return err
		}
		srv, err := ca.Issue("bench server", "127.0.0.1")
		if err != nil {
			return err
		}
		if m.caFile, err = ca.Write(dir, "ca"); err != nil {
			return err
		}
		if m.certFile, m.keyFile, err = srv.Write(dir, "server"); err != nil {
			return err
		}
		m.client = &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		return nil
	}()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

func (m *tlsMaterial) remove() { os.RemoveAll(m.dir) }

// useTLS gives t fresh TLS material, removed when t stops.
func (t *target) useTLS() (*tlsMaterial, error) {
	m, err := newTLSMaterial()
	if err != nil {
		return nil, err
	}
	t.tls = m.client
	prev := t.stop
	t.stop = func() { prev(); m.remove() }
	return m, nil
}

// openLockdTLS starts lockd with TLS on its client port in a child process.
func openLockdTLS(t *target, o *options) error {
	m, err := t.useTLS()
	if err != nil {
		return err
	}
	t.newCodec = func(int) codec { return newLockdCodec() }
	t.queues = true
	t.ping = lockdPing
	return t.startChild("lockd-tls", o.loops, tlsDirEnv+"="+m.dir)
}

// openRedisTLS starts redis-server speaking TLS only.
func openRedisTLS(t *target, o *options) error {
	m, err := t.useTLS()
	if err != nil {
		return err
	}
	pid, err := t.startPeer("", func() (*peer, error) { return startRedisTLS(m) })
	if err != nil {
		return err
	}
	if err := redisSetup(t.addr, m.client); err != nil {
		return err
	}
	t.newCodec = func(int) codec { return newRedisCodec(rand.Uint64() >> 32) }
	t.mem = func() (memStat, error) { return redisMem(t.addr, m.client, pid) }
	t.ping = redisPing
	return nil
}

// handshake runs the client side of a TLS handshake on nc (bounded by
// 10 s) and returns the TLS connection.
func handshake(nc net.Conn, cfg *tls.Config) (net.Conn, error) {
	tc := tls.Client(nc, cfg)
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		nc.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return tc, nil
}

// lockdPing sends a P and reads its pong.
func lockdPing(c net.Conn) error {
	if _, err := c.Write(proto.AppendPing(nil, 1)); err != nil {
		return err
	}
	var (
		buf  [64]byte
		in   []byte
		resp proto.Response
	)
	for {
		n, err := c.Read(buf[:])
		in = append(in, buf[:n]...)
		if _, perr := proto.ParseResponse(in, &resp); perr == nil {
			if resp.Op != proto.OpPing {
				return fmt.Errorf("ping answered %c", resp.Op)
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// redisPing sends PING and reads +PONG.
func redisPing(c net.Conn) error {
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// runHandshakes measures the TLS listener: cfg.Conns goroutines each open
// a connection, finish a full handshake, make one round trip on it (a ping:
// the server serves the connection) and close it, over and over for Dur.
// The rate is handshakes per second; the latency, from dial to the ping's
// answer.
func runHandshakes(t *target, cfg *config, res *Result) error {
	res.Unit = "handshakes/s"
	clk := newClock(cfg, warmOf(cfg))
	shards := newShards(cfg.Conns)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i := range cfg.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sh := shards[i]
			for {
				now := clk.now()
				if clk.stopping(now) || time.Now().After(clk.hardEnd) {
					return
				}
				err := oneHandshake(t)
				end := clk.now()
				sh.mu.Lock()
				switch {
				case err != nil:
					sh.st.errs++
				case clk.inWindow(end):
					sh.st.ops++
					sh.st.acq.Record(end - now)
				}
				sh.mu.Unlock()
				if err != nil {
					mu.Lock()
					if len(errs) < 3 {
						errs = append(errs, err)
					}
					mu.Unlock()
					time.Sleep(10 * time.Millisecond) // a refusing server is not a busy loop
				}
			}
		}()
	}
	wg.Wait()
	st := mergeShards(shards)
	res.fill(st, clk)
	if st.ops == 0 {
		return fmt.Errorf("no handshake succeeded: %w", errors.Join(errs...))
	}
	if len(errs) > 0 && cfg.Progress != nil {
		cfg.Progress(fmt.Sprintf("    %s: %d handshakes failed, e.g. %v", t.name, st.errs, errs[0]))
	}
	return nil
}

// oneHandshake dials t, handshakes, pings and closes.
func oneHandshake(t *target) error {
	nc, err := net.DialTimeout("tcp", t.addr, 10*time.Second)
	if err != nil {
		return err
	}
	c, err := handshake(nc, t.tls)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return t.ping(c)
}
