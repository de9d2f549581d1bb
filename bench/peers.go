package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// peer is a Redis or etcd server process the harness started on loopback
// with a temporary directory.
type peer struct {
	cmd  *exec.Cmd
	dir  string
	addr string // host:port for Redis, http://host:port for etcd
	log  string
	done chan struct{}
}

// stop terminates the peer (SIGTERM, then SIGKILL after 10 s) and removes
// its directory.
func (p *peer) stop() {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	os.RemoveAll(p.dir)
}

func (p *peer) pid() int { return p.cmd.Process.Pid }

// startProcess starts bin with args, output to dir/log.
func startProcess(dir, bin string, args ...string) (*peer, error) {
	logPath := filepath.Join(dir, "log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	p := &peer{cmd: cmd, dir: dir, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); lf.Close(); close(p.done) }()
	return p, nil
}

// failed stops p and returns err with the tail of its log.
func (p *peer) failed(err error) error {
	p.stop()
	return err
}

func (p *peer) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// lookPeer finds a server binary, with a hint on how to install it.
func lookPeer(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found on PATH (install it: apt-get install -y redis-server etcd-server, or run make bench-peers)", name)
	}
	return p, nil
}

// retryStart retries start a few times: the free port it picked may have
// been taken by someone else before the server bound it.
func retryStart(start func() (*peer, error)) (*peer, error) {
	var err error
	for range 3 {
		var p *peer
		if p, err = start(); err == nil {
			return p, nil
		}
	}
	return nil, err
}

// startRedis starts redis-server without persistence on a free loopback port.
func startRedis() (*peer, error) {
	return retryStart(func() (*peer, error) { return startRedisOnce(nil) })
}

// startRedisTLS starts redis-server speaking TLS only, with m's
// certificate (clients are not asked for one).
func startRedisTLS(m *tlsMaterial) (*peer, error) {
	return retryStart(func() (*peer, error) { return startRedisOnce(m) })
}

// startEtcd starts a one-member etcd on free loopback ports.
func startEtcd() (*peer, error) { return retryStart(startEtcdOnce) }

// startRedisOnce starts redis-server once: plaintext, or TLS with m
// (--port 0 --tls-port P; Redis 6+ built with TLS, as Debian's is).
func startRedisOnce(m *tlsMaterial) (*peer, error) {
	bin, err := lookPeer("redis-server")
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	dir, err := os.MkdirTemp("", "bench-redis-")
	if err != nil {
		return nil, err
	}
	plainPort := port
	if m != nil {
		plainPort = "0" // TLS only
	}
	args := []string{"--port", plainPort, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--maxclients", "10200", "--protected-mode", "no", "--daemonize", "no"}
	var ccfg *tls.Config
	if m != nil {
		args = append(args, "--tls-port", port, "--tls-cert-file", m.certFile, "--tls-key-file", m.keyFile,
			"--tls-ca-cert-file", m.caFile, "--tls-auth-clients", "no")
		ccfg = m.client
	}
	p, err := startProcess(dir, bin, args...)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.addr = addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, err := redisCommand(addr, ccfg, "PING"); err == nil && r == "PONG" {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, p.failed(fmt.Errorf("redis-server exited: %s", p.logTail()))
		default:
		}
		if time.Now().After(deadline) {
			return nil, p.failed(fmt.Errorf("redis-server did not answer PING within 10 s: %s", p.logTail()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func startEtcdOnce() (*peer, error) {
	bin, err := lookPeer("etcd")
	if err != nil {
		return nil, err
	}
	ca, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pa, err := freeAddr()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-etcd-")
	if err != nil {
		return nil, err
	}
	client, peerURL := "http://"+ca, "http://"+pa
	p, err := startProcess(dir, bin, "--name", "bench", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "bench="+peerURL, "--log-level", "warn")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.addr = client
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := etcdHealth(client); err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, p.failed(fmt.Errorf("etcd exited: %s", p.logTail()))
		default:
		}
		if time.Now().After(deadline) {
			return nil, p.failed(fmt.Errorf("etcd did not answer within 20 s: %s", p.logTail()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
