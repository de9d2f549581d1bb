package main

import (
	"fmt"
	"log/slog"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// adminMaxConns bounds the admin endpoint's open connections: more wait in
// the kernel's accept queue (they hold no descriptor of lockd's).
const adminMaxConns = 64

// fdMargin is how many descriptors lockd keeps for everything but client
// connections: the runtime and log, each event loop's epoll and eventfd,
// the listeners, the data directory's files, the admin endpoint's
// connections, the HTTP API's (httpConns, --http-max-conns when --http is
// given) and the member links of a cluster.
func fdMargin(loops, httpConns int) int { return 128 + 4*loops + adminMaxConns + httpConns }

// fitConns raises the soft RLIMIT_NOFILE to the hard limit and returns the
// number of client connections that fits under it with fdMargin to spare:
// maxConns, or less (logged) when the limit is lower: client connections
// must leave the node its data files, member links and admin connections
// (an accept that fails with EMFILE only backs off, but the node's own
// files must still open). An error means even one connection does not
// fit.
func fitConns(maxConns, loops, httpConns int, log *slog.Logger) (int, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return maxConns, fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil {
			log.Warn("could not raise the open-file limit to its hard limit", "soft", lim.Cur, "hard", lim.Max, "err", err)
		} else {
			lim = raised
		}
	}
	margin := uint64(fdMargin(loops, httpConns))
	if lim.Cur <= margin {
		return 0, fmt.Errorf("open-file limit %d leaves no room for client connections (lockd keeps %d for itself); raise it (ulimit -n)", lim.Cur, margin)
	}
	room := lim.Cur - margin
	if uint64(maxConns) <= room {
		return maxConns, nil
	}
	log.Warn("--max-conns lowered to fit the open-file limit", "max_conns", maxConns, "effective", room,
		"fd_limit", lim.Cur, "reserved_fds", margin)
	return int(room), nil
}

// clusterProcs is the GOMAXPROCS a member of a cluster runs with, or 0 to
// leave it as it is: a single node, a GOMAXPROCS set in the environment, or
// more processors than event loops already. With one processor per event
// loop, a loop that stays busy holds its processor until the runtime
// preempts it (every 10 ms), and the cluster's own goroutines — the
// replication flusher, the member link's readers and writers, raft's
// loops — wait that long: a standby's acknowledgements arrived up to 10–15
// ms late at the p99 under load. One processor more than the loops gives
// them one to run on at once; the kernel shares the cores between the
// threads.
func clusterProcs(cluster string, loops int, env string, cur int) int {
	if cluster == "" || env != "" || cur > loops {
		return 0
	}
	return loops + 1
}

// limitListener accepts at most n connections at a time: Accept waits
// while n are open, leaving further ones in the kernel's queue.
type limitListener struct {
	net.Listener
	sem chan struct{}
}

func limitListen(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.sem <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
