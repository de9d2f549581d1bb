package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// The semaphore on Redis is Redisson's RPermitExpirableSemaphore
// (org.redisson.RedissonPermitExpirableSemaphore), whose scripts these
// follow: the semaphore "name" is a counter of the permits available (set
// to the limit before the run, as trySetPermits does); "{name}:timeout" is
// a sorted set of the permits handed out, each a random id scored by its
// expiry (wall-clock milliseconds); "redisson_sc:{name}" is the channel a
// release announces on. Redisson's plain RSemaphore (a bare counter) was
// not taken: a client that dies holding a permit never gives it back
// (redisson#4462), which the other two targets do not allow (lockd's lease,
// etcd's session).
//
// acquire (ARGV: permits, expiry, now, id): first give back up to
// `permits` expired permits (and announce them), then take one if the
// counter allows; refused, it answers the nearest expiry, so the client
// knows when a permit comes back without a release.
//
// release (ARGV: id, now): remove the id, give its permit back, announce
// the count now available; 0 if the id was not there, or had expired
// (the permit was given back, but the holder had lost it).
const (
	redisSemAcquire = `local expired = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, ARGV[1])
if #expired > 0 then
  redis.call('zrem', KEYS[2], unpack(expired))
  local value = redis.call('incrby', KEYS[1], #expired)
  if tonumber(value) > 0 then redis.call('publish', KEYS[3], value) end
end
local value = redis.call('get', KEYS[1])
if value ~= false and tonumber(value) >= tonumber(ARGV[1]) then
  redis.call('decrby', KEYS[1], ARGV[1])
  redis.call('zadd', KEYS[2], ARGV[2], ARGV[4])
  return 'OK'
end
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if v[1] ~= nil then return ':' .. v[2] end
return false`
	redisSemRelease = `local expire = redis.call('zscore', KEYS[2], ARGV[1])
local removed = redis.call('zrem', KEYS[2], ARGV[1])
if tonumber(removed) ~= 1 then return 0 end
local value = redis.call('incrby', KEYS[1], 1)
redis.call('publish', KEYS[3], value)
if tonumber(expire) <= tonumber(ARGV[2]) then return 0 end
return 1`
)

var (
	redisSemAcquireSHA = sha1hex(redisSemAcquire)
	redisSemReleaseSHA = sha1hex(redisSemRelease)
)

// The semaphore's other keys, named as Redisson names them.
func semTimeoutKey[S ~string | ~[]byte](dst []byte, name S) []byte {
	dst = append(dst, '{')
	dst = append(dst, name...)
	return append(dst, "}:timeout"...)
}

func semChannel[S ~string | ~[]byte](dst []byte, name S) []byte {
	dst = append(dst, "redisson_sc:{"...)
	dst = append(dst, name...)
	return append(dst, '}')
}

// encodeSem writes a semaphore acquire or release (EVALSHA); the permit's
// id is the value the codec would lock a key with, unique per connection.
func (c *redisCodec) encodeSem(dst []byte, s *slot, a action) []byte {
	var scratch [64]byte
	now := uint64(time.Now().UnixMilli())
	var token uint64
	switch a.op {
	case opAcquire:
		c.seq++
		token = c.prefix | c.seq
		dst = appendArray(dst, 10)
		dst = appendBulk(dst, "EVALSHA")
		dst = appendBulk(dst, redisSemAcquireSHA)
		dst = appendBulk(dst, "3")
		dst = appendBulk(dst, a.key)
		dst = appendBulk(dst, semTimeoutKey(scratch[:0], a.key))
		dst = appendBulk(dst, semChannel(scratch[:0], a.key))
		dst = appendBulk(dst, "1")
		dst = appendBulkUint(dst, now+uint64(a.lease)*1000)
		dst = appendBulkUint(dst, now)
		dst = appendBulkUint(dst, token)
	case opRelease:
		dst = appendArray(dst, 8)
		dst = appendBulk(dst, "EVALSHA")
		dst = appendBulk(dst, redisSemReleaseSHA)
		dst = appendBulk(dst, "3")
		dst = appendBulk(dst, a.key)
		dst = appendBulk(dst, semTimeoutKey(scratch[:0], a.key))
		dst = appendBulk(dst, semChannel(scratch[:0], a.key))
		dst = appendBulkUint(dst, a.token)
		dst = appendBulkUint(dst, now)
	default:
		return dst
	}
	c.push(redisPending{slot: int32(s.local), op: a.op, sem: true, token: token})
	return dst
}

// decodeSem classifies the reply to a semaphore script: for an acquire,
// "OK" (granted), ":<ms>" (refused; the nearest permit expires then, in
// a.token) or nil (refused, nothing to wait for); for a release, 1 or 0.
func decodeSem(p redisPending, typ byte, line []byte, a *answer) {
	switch {
	case typ == '-':
		a.kind = ansError
	case p.op == opAcquire && typ == '$' && string(line) == "OK":
		a.kind, a.token = ansGranted, p.token
	case p.op == opAcquire && typ == '$' && len(line) > 1 && line[0] == ':':
		a.kind = ansRefused
		if f, err := strconv.ParseFloat(string(line[1:]), 64); err == nil && f > 0 {
			a.token = uint64(f)
		}
	case p.op == opAcquire && typ == '$' && string(line) == "-1": // nil: respReply leaves the length
		a.kind = ansRefused
	case p.op == opRelease && typ == ':' && string(line) == "1":
		a.kind = ansReleased
	case p.op == opRelease && typ == ':':
		a.kind = ansNotHeld
	default:
		a.kind = ansError
	}
}

// semSetupFor returns how the semaphore workload prepares target t: for
// the Redis targets (their codec speaks RESP), the scripts, the counters
// and a subscriber per connection; nil for the others.
func semSetupFor(t *target) func(w *semaphore, conns int) (stop func(), err error) {
	if t.newCodec == nil {
		return nil
	}
	if _, ok := t.newCodec(0).(*redisCodec); !ok {
		return nil
	}
	return func(w *semaphore, conns int) (func(), error) { return redisSemSetup(t.addr, t.tls, w, conns) }
}

// redisSemSetup loads the scripts, sets every key's counter to the limit
// with no permit handed out, and subscribes one connection per load
// connection to every key's channel; stop closes the subscribers.
func redisSemSetup(addr string, cfg *tls.Config, w *semaphore, conns int) (stop func(), err error) {
	for _, s := range []struct{ src, sha string }{{redisSemAcquire, redisSemAcquireSHA}, {redisSemRelease, redisSemReleaseSHA}} {
		got, err := redisCommand(addr, cfg, "SCRIPT", "LOAD", s.src)
		if err != nil {
			return nil, err
		}
		if got != s.sha {
			return nil, fmt.Errorf("redis SCRIPT LOAD: sha %s, want %s", got, s.sha)
		}
	}
	for _, k := range w.hot {
		if _, err := redisCommand(addr, cfg, "DEL", string(k), string(semTimeoutKey(nil, k))); err != nil {
			return nil, err
		}
		if _, err := redisCommand(addr, cfg, "SET", string(k), strconv.Itoa(int(w.limit))); err != nil {
			return nil, err
		}
	}
	// Each connection carries the slots s.id ≡ i (mod conns) (makeSlots).
	room := make([][]int, conns)
	for i := range room {
		room[i] = make([]int, len(w.hot))
	}
	for id := range w.grants {
		room[id%conns][id%len(w.hot)]++
	}
	stop = func() {
		for _, n := range w.notify {
			n.nc.Close()
			<-n.done
		}
		w.notify = nil
	}
	for i := range conns {
		n, err := subscribe(addr, cfg, w, room[i])
		if err != nil {
			stop()
			return nil, err
		}
		w.notify = append(w.notify, n)
	}
	return stop, nil
}

// subscribe opens a subscriber to the channel of every hot key some slot
// of its connection uses (room: how many), waits until
// Redis has confirmed each subscription (no release after that is
// missed), and starts reading its messages.
func subscribe(addr string, cfg *tls.Config, w *semaphore, room []int) (*semNotifier, error) {
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		if nc, err = handshake(nc, cfg); err != nil {
			return nil, err
		}
	}
	n := &semNotifier{w: w, keys: map[string]int{}, nc: nc, done: make(chan struct{}),
		waiting: make([][]semWaiter, len(w.hot)), credit: make([]int, len(w.hot)), room: room}
	var chans [][]byte
	for i, k := range w.hot {
		if room[i] > 0 { // as a Redisson client, only the semaphores it waits on
			chans = append(chans, semChannel(nil, k))
			n.keys[string(chans[len(chans)-1])] = i
		}
	}
	cmd := appendArray(nil, 1+len(chans))
	cmd = appendBulk(cmd, "SUBSCRIBE")
	for _, ch := range chans {
		cmd = appendBulk(cmd, ch)
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(cmd); err != nil {
		nc.Close()
		return nil, err
	}
	br := bufio.NewReader(nc)
	for confirmed := 0; confirmed < len(chans); {
		msg, err := readPush(br)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("redis SUBSCRIBE: %w", err)
		}
		if len(msg) < 1 || string(msg[0]) != "subscribe" {
			nc.Close()
			return nil, fmt.Errorf("redis SUBSCRIBE: unexpected reply %q", msg)
		}
		confirmed++
	}
	_ = nc.SetDeadline(time.Time{})
	go n.read(br)
	return n, nil
}

// read delivers the channel's messages until the connection closes.
func (n *semNotifier) read(br *bufio.Reader) {
	defer close(n.done)
	for {
		msg, err := readPush(br)
		if err != nil {
			return
		}
		if len(msg) != 3 || string(msg[0]) != "message" {
			continue
		}
		k, ok := n.keys[string(msg[1])]
		permits, err := strconv.Atoi(string(msg[2]))
		if ok && err == nil && permits > 0 {
			n.announce(k, permits)
		}
	}
}

// readPush reads one RESP2 array of bulk strings and integers (a pub/sub
// message or a subscription's confirmation).
func readPush(r *bufio.Reader) ([][]byte, error) {
	line := func() ([]byte, error) {
		l, err := r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		if len(l) < 3 || l[len(l)-2] != '\r' {
			return nil, fmt.Errorf("redis: a subscriber got the line %q", l)
		}
		return l[:len(l)-2], nil
	}
	head, err := line()
	if err != nil {
		return nil, err
	}
	count, err := strconv.Atoi(string(head[1:]))
	if head[0] != '*' || err != nil || count < 0 || count > 16 {
		return nil, fmt.Errorf("redis: a subscriber got %q, not an array", head)
	}
	msg := make([][]byte, count)
	for i := range msg {
		l, err := line()
		if err != nil {
			return nil, err
		}
		switch l[0] {
		case ':':
			msg[i] = append([]byte(nil), l[1:]...)
		case '$':
			size, err := strconv.Atoi(string(l[1:]))
			if err != nil || size < 0 || size > 1<<20 {
				return nil, fmt.Errorf("redis: a subscriber got the bulk length %q", l)
			}
			msg[i] = make([]byte, size+2)
			if _, err := io.ReadFull(r, msg[i]); err != nil {
				return nil, err
			}
			msg[i] = msg[i][:size]
		default:
			return nil, fmt.Errorf("redis: a subscriber got the element %q", l)
		}
	}
	return msg, nil
}
