package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// etcdDriver drives etcd v3 through its JSON gateway (etcd 3.4 serves
// /v3/...): an acquire is a txn "create_revision(key) == 0 → put key with
// the slot's lease", its fencing token the revision of that put; a release
// is a txn "mod_revision(key) == token → delete key". HTTP/1.1 does not
// pipeline, so every slot is its own goroutine with one request in flight.
type etcdDriver struct {
	base    string // http://host:port
	client  *http.Client
	lastErr atomic.Value // error: the last request failure, for the report
}

func newEtcdDriver(base string, conns int) *etcdDriver {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: 30 * time.Second}
	return &etcdDriver{base: base, client: &http.Client{Transport: tr, Timeout: 15 * time.Second}}
}

type etcdHeader struct {
	Revision string `json:"revision"`
}

type etcdResp struct {
	Header    etcdHeader `json:"header"`
	Succeeded bool       `json:"succeeded"`
	ID        string     `json:"ID"`
	Error     string     `json:"error"`
	Result    *struct {
		TTL string `json:"TTL"`
	} `json:"result"` // lease keep-alive (a stream of one message here)
}

func (d *etcdDriver) post(path string, body []byte, r *etcdResp) error {
	resp, err := d.client.Post(d.base+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	*r = etcdResp{}
	return json.Unmarshal(b, r)
}

// grantLease returns a new lease of ttl seconds.
func (d *etcdDriver) grantLease(ttl int) (int64, error) {
	var r etcdResp
	if err := d.post("/v3/lease/grant", []byte(`{"TTL":`+strconv.Itoa(ttl)+`}`), &r); err != nil {
		return 0, err
	}
	return strconv.ParseInt(r.ID, 10, 64)
}

func b64[S ~string | ~[]byte](s S) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// do performs a (acquire or release) for a slot holding lease.
func (d *etcdDriver) do(s *slot, a *action, lease int64) answer {
	k := b64(a.key)
	var body []byte
	switch a.op {
	case opAcquire:
		body = fmt.Appendf(nil, `{"compare":[{"target":"CREATE","key":%q,"create_revision":"0"}],`+
			`"success":[{"request_put":{"key":%q,"value":%q,"lease":"%d"}}]}`, k, k, b64(strconv.Itoa(s.id)), lease)
	case opRelease:
		body = fmt.Appendf(nil, `{"compare":[{"target":"MOD","key":%q,"mod_revision":"%d"}],`+
			`"success":[{"request_delete_range":{"key":%q}}]}`, k, a.token, k)
	case opRenew:
		// The lock lives as long as its lease: renewing is a keep-alive.
		var r etcdResp
		if err := d.post("/v3/lease/keepalive", fmt.Appendf(nil, `{"ID":"%d"}`, lease), &r); err != nil {
			d.lastErr.Store(err)
			return answer{kind: ansError, slot: s.local}
		}
		if r.Result == nil || r.Result.TTL == "" || r.Result.TTL == "0" {
			return answer{kind: ansNotHeld, slot: s.local}
		}
		return answer{kind: ansRenewed, slot: s.local}
	default:
		return answer{kind: ansError, slot: s.local}
	}
	var r etcdResp
	if err := d.post("/v3/kv/txn", body, &r); err != nil {
		d.lastErr.Store(err)
		return answer{kind: ansError, slot: s.local}
	}
	switch {
	case a.op == opAcquire && r.Succeeded:
		rev, _ := strconv.ParseUint(r.Header.Revision, 10, 64)
		return answer{kind: ansGranted, slot: s.local, token: rev}
	case a.op == opAcquire:
		return answer{kind: ansRefused, slot: s.local}
	case r.Succeeded:
		return answer{kind: ansReleased, slot: s.local}
	default:
		return answer{kind: ansNotHeld, slot: s.local}
	}
}

// warmConns opens up to n connections by sending n range requests at once.
func (d *etcdDriver) warmConns(n int) error {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- d.health() }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// etcdMem reads etcd's Go heap in use from its /metrics (no GC is forced:
// it includes garbage) and its RSS when the process is known.
func etcdMem(d *etcdDriver, pid int) (memStat, error) {
	resp, err := d.client.Get(d.base + "/metrics")
	if err != nil {
		return memStat{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return memStat{}, err
	}
	var m memStat
	for _, l := range strings.Split(string(b), "\n") {
		for _, name := range []string{"go_memstats_heap_inuse_bytes ", "go_memstats_stack_inuse_bytes "} {
			if v, ok := strings.CutPrefix(l, name); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				m.Heap += int64(f)
			}
		}
	}
	if pid > 0 {
		m.RSS = rssOf(pid)
	}
	return m, nil
}

// health reports whether etcd answers a range request.
func (d *etcdDriver) health() error {
	var r etcdResp
	return d.post("/v3/kv/range", []byte(`{"key":"`+b64("bench/health")+`"}`), &r)
}
