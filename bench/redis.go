package main

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Redis lock recipes (the single-instance Redlock / redsync way): acquire is
// SET key value NX PX ms with a unique value; release and renew are Lua
// scripts that act only while the key still holds that value.
const (
	redisRelease = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
	redisRenew   = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`
)

func sha1hex(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

var (
	redisReleaseSHA = sha1hex(redisRelease)
	redisRenewSHA   = sha1hex(redisRenew)
)

// redisCodec speaks RESP2. Redis answers in order, so answers are routed by
// a FIFO of the slots that sent the requests. The lock value ("token") is a
// per-connection counter made unique by a random per-connection prefix.
type redisCodec struct {
	fifo   []redisPending
	head   int
	prefix uint64
	seq    uint64
}

type redisPending struct {
	slot  int32
	op    opKind
	sem   bool // a semaphore's script (semaphore_redis.go)
	token uint64
}

func newRedisCodec(prefix uint64) codec { return &redisCodec{prefix: prefix << 32} }

func appendBulk[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '$')
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	dst = append(dst, '\r', '\n')
	dst = append(dst, s...)
	return append(dst, '\r', '\n')
}

func appendBulkUint(dst []byte, v uint64) []byte {
	var b [20]byte
	return appendBulk(dst, strconv.AppendUint(b[:0], v, 10))
}

func appendArray(dst []byte, n int) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '\r', '\n')
}

func (c *redisCodec) encode(dst []byte, s *slot, a action) []byte {
	if a.limit > 0 {
		return c.encodeSem(dst, s, a)
	}
	var token uint64
	switch a.op {
	case opAcquire:
		c.seq++
		token = c.prefix | c.seq // the value the slot will hold the key with
		dst = appendArray(dst, 6)
		dst = appendBulk(dst, "SET")
		dst = appendBulk(dst, a.key)
		dst = appendBulkUint(dst, token)
		dst = appendBulk(dst, "NX")
		dst = appendBulk(dst, "PX")
		dst = appendBulkUint(dst, uint64(a.lease)*1000)
	case opRelease:
		dst = appendArray(dst, 5)
		dst = appendBulk(dst, "EVALSHA")
		dst = appendBulk(dst, redisReleaseSHA)
		dst = appendBulk(dst, "1")
		dst = appendBulk(dst, a.key)
		dst = appendBulkUint(dst, a.token)
	case opRenew:
		dst = appendArray(dst, 6)
		dst = appendBulk(dst, "EVALSHA")
		dst = appendBulk(dst, redisRenewSHA)
		dst = appendBulk(dst, "1")
		dst = appendBulk(dst, a.key)
		dst = appendBulkUint(dst, a.token)
		dst = appendBulkUint(dst, uint64(a.lease)*1000)
	default:
		return dst
	}
	c.push(redisPending{slot: int32(s.local), op: a.op, token: token})
	return dst
}

// push queues the routing of the next reply.
func (c *redisCodec) push(p redisPending) {
	if c.head > 0 && c.head == len(c.fifo) {
		c.fifo, c.head = c.fifo[:0], 0
	}
	c.fifo = append(c.fifo, p)
}

// respReply parses one RESP reply: its type byte, the line after it, and
// the frame length. Bulk strings' payloads are skipped; arrays are not
// supported (no command used here answers with one).
func respReply(in []byte) (typ byte, line []byte, n int, err error) {
	i := bytes.Index(in, []byte("\r\n"))
	if i < 0 {
		return 0, nil, 0, errIncomplete
	}
	if i == 0 {
		return 0, nil, 0, errors.New("redis: empty reply line")
	}
	typ, line, n = in[0], in[1:i], i+2
	if typ == '$' {
		l, perr := strconv.Atoi(string(line))
		if perr != nil {
			return 0, nil, 0, fmt.Errorf("redis: bad bulk length %q", line)
		}
		if l >= 0 {
			if l > len(in)-n-2 { // not n+l+2 > len(in): l may be huge
				return 0, nil, 0, errIncomplete
			}
			line = in[n : n+l]
			n += l + 2
		}
	}
	return typ, line, n, nil
}

func (c *redisCodec) decode(in []byte, a *answer) (int, error) {
	typ, line, n, err := respReply(in)
	if err != nil {
		return 0, err
	}
	if c.head >= len(c.fifo) {
		return 0, errors.New("redis: reply without a request")
	}
	p := c.fifo[c.head]
	c.head++
	*a = answer{slot: int(p.slot)}
	if p.sem {
		decodeSem(p, typ, line, a)
		return n, nil
	}
	switch {
	case typ == '-':
		a.kind = ansError
	case p.op == opAcquire && typ == '+':
		a.kind, a.token = ansGranted, p.token
	case p.op == opAcquire && typ == '$': // nil: the key is held
		a.kind = ansRefused
	case typ == ':' && string(line) == "1":
		a.kind = ansReleased
		if p.op == opRenew {
			a.kind = ansRenewed
		}
	case typ == ':':
		a.kind = ansNotHeld
	default:
		a.kind = ansError
	}
	return n, nil
}

// redisCommand sends one command on a connection of its own (TLS with
// cfg, if not nil) and returns the first reply line (for a bulk reply, its
// payload).
func redisCommand(addr string, cfg *tls.Config, args ...string) (string, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	if cfg != nil {
		tc := tls.Client(nc, cfg)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return "", err
		}
		nc = tc
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	var b []byte
	b = appendArray(b, len(args))
	for _, a := range args {
		b = appendBulk(b, a)
	}
	if _, err := nc.Write(b); err != nil {
		return "", err
	}
	br := bufio.NewReader(nc)
	var in []byte
	for {
		typ, line, _, err := respReply(in)
		if err == nil {
			if typ == '-' {
				return "", fmt.Errorf("redis %s: %s", args[0], line)
			}
			return string(line), nil
		}
		if err != errIncomplete {
			return "", err
		}
		chunk := make([]byte, 64<<10)
		n, err := br.Read(chunk)
		if err != nil {
			return "", err
		}
		in = append(in, chunk[:n]...)
	}
}

// redisSetup loads the release and renew scripts.
func redisSetup(addr string, cfg *tls.Config) error {
	for _, s := range []struct{ src, sha string }{{redisRelease, redisReleaseSHA}, {redisRenew, redisRenewSHA}} {
		got, err := redisCommand(addr, cfg, "SCRIPT", "LOAD", s.src)
		if err != nil {
			return err
		}
		if got != s.sha {
			return fmt.Errorf("redis SCRIPT LOAD: sha %s, want %s", got, s.sha)
		}
	}
	return nil
}

// redisMem returns used_memory from INFO memory, and the RSS of pid if known.
func redisMem(addr string, cfg *tls.Config, pid int) (memStat, error) {
	info, err := redisCommand(addr, cfg, "INFO", "memory")
	if err != nil {
		return memStat{}, err
	}
	var m memStat
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
			m.Heap, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory_rss:"); ok && pid == 0 {
			m.RSS, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if pid > 0 {
		m.RSS = rssOf(pid)
	}
	return m, nil
}
