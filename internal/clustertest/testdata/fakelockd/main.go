// Command fakelockd stands in for lockd in clustertest's own tests, so the
// cluster paths of the harness (the §6.1 flags, proxies between members,
// Partition) run with real processes before lockd has cluster modes. It
// takes lockd's flags, checks the §6.1 ones as lockd must (--self in
// --peers, exit 2 otherwise), and:
//
//   - on its client port answers every 10-byte ping frame with M naming its
//     own --self (so a test can tell which member a path reaches);
//   - dials every other member at its --peers entry's port + offset
//     (redialling on any error), accepts members on its member port (client
//     port + --peer-offset), and on every such link sends a line with its
//     index in --peers every 50 ms and reads the other side's;
//   - serves /status on --admin: {"role":"fake","addr":…,"heard":[…]},
//     heard[k] true when member k was heard from within the last 300 ms;
//   - logs "admin endpoint" and "ready" like lockd, in json or text.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	fs := flag.NewFlagSet("fakelockd", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7070", "")
	admin := fs.String("admin", "", "")
	format := fs.String("log-format", "text", "")
	fs.String("data-dir", "", "")
	mode := fs.String("cluster", "", "")
	peersFlag := fs.String("peers", "", "")
	self := fs.String("self", "", "")
	offset := fs.Int("peer-offset", 10000, "")
	fs.Duration("failover-timeout", time.Second, "")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, nil)
	if *format == "json" {
		h = slog.NewJSONHandler(os.Stderr, nil)
	}
	log := slog.New(h)
	peers := strings.Split(*peersFlag, ",")
	if *self == "" {
		*self = *listen
	}
	me := slices.Index(peers, *self)
	if *mode == "" || me < 0 {
		fmt.Fprintf(os.Stderr, "fakelockd: --self %q not in --peers %q (or no --cluster)\n", *self, *peersFlag)
		os.Exit(2)
	}

	var mu sync.Mutex
	heard := make([]time.Time, len(peers))

	cl, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("start failed", "err", err)
		os.Exit(1)
	}
	host, port, _ := net.SplitHostPort(*listen)
	p, _ := strconv.Atoi(port)
	ml, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p+*offset)))
	if err != nil {
		log.Error("start failed", "err", err)
		os.Exit(1)
	}
	al, err := net.Listen("tcp", *admin)
	if err != nil {
		log.Error("start failed", "err", err)
		os.Exit(1)
	}
	http.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		h := make([]bool, len(peers))
		for k, t := range heard {
			h[k] = k != me && time.Since(t) < 300*time.Millisecond
		}
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"role": "fake", "addr": *listen, "heard": h, "epoch": "7"})
	})
	go func() { _ = http.Serve(al, nil) }()
	log.Info("admin endpoint", "addr", al.Addr().String())

	go serve(cl, func(c net.Conn) { // clients: M naming --self for every ping
		var buf []byte
		tmp := make([]byte, 512)
		for {
			n, err := c.Read(tmp)
			buf = append(buf, tmp[:n]...)
			for len(buf) >= 10 && buf[0] == 'P' {
				out := append([]byte{'M', 'P'}, buf[1:9]...)
				out = append(append(out, *self...), '\n')
				if _, err := c.Write(out); err != nil {
					return
				}
				buf = buf[10:]
			}
			if err != nil {
				return
			}
		}
	})
	// A member link carries beats both ways: from the member that dialled
	// and from the one that accepted.
	listenBeats := func(c net.Conn) {
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if k, err := strconv.Atoi(sc.Text()); err == nil && k >= 0 && k < len(peers) {
				mu.Lock()
				heard[k] = time.Now()
				mu.Unlock()
			}
		}
	}
	go serve(ml, func(c net.Conn) {
		go func() { sendBeats(c, me); c.Close() }()
		listenBeats(c)
	})
	for k, entry := range peers {
		if k == me {
			continue
		}
		h, pt, _ := net.SplitHostPort(entry)
		pn, _ := strconv.Atoi(pt)
		addr := net.JoinHostPort(h, strconv.Itoa(pn+*offset))
		go func() {
			for {
				if c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond); err == nil {
					go listenBeats(c)
					sendBeats(c, me)
					c.Close()
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	log.Info("ready", "addr", cl.Addr().String())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	os.Exit(0)
}

func serve(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); handle(c) }()
	}
}

// sendBeats writes me's index on c every 50 ms until a write fails.
func sendBeats(c net.Conn, me int) {
	line := []byte(strconv.Itoa(me) + "\n")
	for {
		_ = c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Write(line); err != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
