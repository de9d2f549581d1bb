package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/clustertest"
	"github.com/lockd-dev/lockd/internal/openapitest"
	"github.com/lockd-dev/lockd/internal/wait"
)

// The HTTP API (--http, docs/HTTP.md) on real lockd processes: every
// member of a cluster answers, forwarding to the one that serves; a
// long-poll gets a truthful answer when the active or leader is killed
// (kill -9) or stopped (SIGTERM), and no lock is left that nobody holds.
// Every answer is checked against the OpenAPI document the members serve.

// httpOffset puts each member's HTTP port at its client port + 2000.
const httpOffset = 2000

// web is an HTTP client of a cluster's members whose every answer is
// checked against the OpenAPI document they serve.
type web struct {
	t *testing.T
	c *http.Client
}

func newWeb(t *testing.T, c *clustertest.Cluster) *web {
	t.Helper()
	resp, err := http.Get("http://" + c.Member(0).HTTPAddr() + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	doc, err := openapitest.Load(b)
	if err != nil {
		t.Fatalf("the served OpenAPI document: %v", err)
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &web{t: t, c: &http.Client{Transport: openapitest.Transport(t, doc, tr),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// reply is a decoded answer; status 0 and err for a transport error.
type reply struct {
	status int
	body   map[string]any
	raw    string
	err    error
}

func (r reply) str(k string) string { s, _ := r.body[k].(string); return s }
func (r reply) num(k string) int64 {
	n, _ := r.body[k].(json.Number)
	v, _ := n.Int64()
	return v
}
func (r reply) code() string {
	e, _ := r.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func (w *web) post(ctx context.Context, addr, path, body string) reply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.c.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: string(raw), err: err}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	_ = d.Decode(&r.body)
	return r
}

// must posts and fails the test unless the answer has status.
func (w *web) must(addr, path, body string, status int) reply {
	w.t.Helper()
	r := w.post(context.Background(), addr, path, body)
	if r.err != nil || r.status != status {
		w.t.Fatalf("POST %s%s %s: %d %s %v, want %d", addr, path, body, r.status, r.raw, r.err, status)
	}
	return r
}

// async posts in the background.
func (w *web) async(addr, path, body string) <-chan reply {
	ch := make(chan reply, 1)
	go func() { ch <- w.post(context.Background(), addr, path, body) }()
	return ch
}

func tokenOf(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 {
		t.Fatalf("token %q", s)
	}
	return v
}

// waitWaiters waits until key has n waiters on the serving member.
func (w *web) waitWaiters(addr, key string, n int64) {
	w.t.Helper()
	var r reply
	wait.For(w.t, fmt.Sprintf("key %s with %d waiters at %s", key, n, addr), func() bool {
		r = w.post(context.Background(), addr, "/v1/inspect", `{"key":"`+key+`"}`)
		return r.status == 200 && r.num("waiters") == n
	})
}

// replicated waits until every running member's table has key held with
// token tok: the grant outlives its member's death.
func replicated(t *testing.T, c *clustertest.Cluster, key, tok string) {
	t.Helper()
	want := tokenOf(t, tok)
	for _, m := range c.Members() {
		if !m.Alive() {
			continue
		}
		wait.For(t, fmt.Sprintf("%s held with token %d at member %d", key, want, m.Index()), func() bool {
			held, got := keyState(t, c, m.Index(), key)
			return held && got == want
		})
	}
}

func TestHTTPPriority(t *testing.T) { testHTTPCluster(t, clustertest.ModePriority) }
func TestHTTPRaft(t *testing.T)     { testHTTPCluster(t, clustertest.ModeRaft) }

func testHTTPCluster(t *testing.T, mode string) {
	short(t)
	c := clustertest.Start(t, clustertest.Options{Mode: mode, Members: 3, HTTPOffset: httpOffset})
	noRaces(t, c)
	lead, _ := waitServing(t, c, 20*time.Second)
	w := newWeb(t, c)
	others := func(lead int) (a, b int) { return (lead + 1) % 3, (lead + 2) % 3 }
	at := func(i int) string { return c.Member(i).HTTPAddr() }

	t.Run("every member answers", func(t *testing.T) {
		for i := range 3 {
			key := "k/" + strconv.Itoa(i)
			g := w.must(at(i), "/v1/acquire", `{"key":"`+key+`","lease_ms":30000}`, 200)
			tok := g.str("token")
			for j := range 3 {
				if r := w.must(at(j), "/v1/inspect", `{"key":"`+key+`"}`, 200); r.str("token") != tok || r.num("holders") != 1 {
					t.Fatalf("inspect at %d: %s", j, r.raw)
				}
			}
			w.must(at((i+1)%3), "/v1/validate", `{"key":"`+key+`","token":"`+tok+`"}`, 200)
			w.must(at((i+2)%3), "/v1/release", `{"key":"`+key+`","token":"`+tok+`"}`, 200)
			w.must(at(i), "/v1/release", `{"key":"`+key+`","token":"`+tok+`"}`, 409)
		}
	})
	t.Run("a forwarded request at a member that does not serve", func(t *testing.T) {
		// What a member answers another member's forward that reached it
		// after a failover: 421 naming the active, not executed.
		a, _ := others(lead)
		req, _ := http.NewRequest(http.MethodPost, "http://"+at(a)+"/v1/acquire", strings.NewReader(`{"key":"f","lease_ms":30000}`))
		req.Header.Set("Lockd-Forwarded", "1")
		resp, err := w.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := reply{status: resp.StatusCode, raw: string(raw)}
		_ = decodeInto(raw, &r.body)
		if e, _ := r.body["error"].(map[string]any); r.status != http.StatusMisdirectedRequest || r.code() != "not_serving" || e["active"] != c.Member(lead).Addr() {
			t.Fatalf("at member %d: %d %s", a, r.status, r.raw)
		}
		if r := w.must(at(lead), "/v1/inspect", `{"key":"f"}`, 200); r.num("holders") != 0 {
			t.Fatalf("the 421 request was executed: %s", r.raw)
		}
	})
	t.Run("a watch through another member", func(t *testing.T) {
		a, _ := others(lead)
		tok := w.must(at(lead), "/v1/acquire", `{"key":"w","lease_ms":30000}`, 200).str("token")
		resp, err := w.c.Get("http://" + at(a) + "/v1/watch?key=w&token=" + tok)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("watch at a member that does not serve: %v %v", err, resp)
		}
		defer resp.Body.Close()
		events := readEvents(resp.Body)
		if ev := <-events; ev[0] != "watching" {
			t.Fatalf("first event %v", ev)
		}
		w.must(at(a), "/v1/release", `{"key":"w","token":"`+tok+`"}`, 200)
		select {
		case ev := <-events:
			if ev[0] != "lost" || !strings.Contains(ev[1], `"reason_name":"released"`) {
				t.Fatalf("event %v", ev)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no lost event")
		}
	})

	t.Run("kill -9 during long-polls", func(t *testing.T) {
		a, _ := others(lead)
		held := w.must(at(lead), "/v1/acquire", `{"key":"kk","lease_ms":60000}`, 200)
		tok := held.str("token")
		viaOther := w.async(at(a), "/v1/acquire", `{"key":"kk","lease_ms":5000,"wait_ms":20000}`)
		direct := w.async(at(lead), "/v1/acquire", `{"key":"kk","lease_ms":5000,"wait_ms":20000}`)
		w.waitWaiters(at(lead), "kk", 2)
		replicated(t, c, "kk", tok)
		if err := c.Member(lead).Kill(); err != nil {
			t.Fatal(err)
		}
		// Forwarded: the member that executed it died with the request
		// possibly executed: indeterminate, never a grant nor a timeout.
		if r := <-viaOther; r.status != http.StatusBadGateway || r.code() != "indeterminate" {
			t.Fatalf("the long-poll through member %d: %d %s %v", a, r.status, r.raw, r.err)
		}
		if r := <-direct; r.err == nil {
			t.Fatalf("the long-poll at the killed member was answered: %d %s", r.status, r.raw)
		}
		nl, _ := waitServing(t, c, 20*time.Second, lead)
		// No phantom lock: the key is held by its holder alone, with its
		// token; nobody waits; releasing it frees it.
		r := w.must(at(nl), "/v1/inspect", `{"key":"kk"}`, 200)
		if r.num("holders") != 1 || r.str("token") != tok || r.num("waiters") != 0 {
			t.Fatalf("after the failover: %s (held by %s)", r.raw, tok)
		}
		w.must(at(a), "/v1/release", `{"key":"kk","token":"`+tok+`"}`, 200)
		if r := w.must(at(nl), "/v1/inspect", `{"key":"kk"}`, 200); r.num("holders") != 0 {
			t.Fatalf("after the release: %s", r.raw)
		}
		if err := c.Member(lead).Restart(); err != nil {
			t.Fatal(err)
		}
		lead = settled(t, c, mode)
	})

	t.Run("SIGTERM during long-polls", func(t *testing.T) {
		a, _ := others(lead)
		tok := tokenOf(t, w.must(at(lead), "/v1/acquire", `{"key":"ks","lease_ms":60000}`, 200).str("token"))
		viaOther := w.async(at(a), "/v1/acquire", `{"key":"ks","lease_ms":5000,"wait_ms":30000}`)
		w.waitWaiters(at(lead), "ks", 1)
		direct := w.async(at(lead), "/v1/acquire", `{"key":"ks","lease_ms":5000,"wait_ms":30000}`)
		w.waitWaiters(at(lead), "ks", 2)
		replicated(t, c, "ks", strconv.FormatUint(tok, 10))
		done := make(chan error, 1)
		go func() {
			code, err := c.Member(lead).Term()
			if err == nil && code != 0 {
				err = errExit(code)
			}
			done <- err
		}()
		// At the member that stops: not executed, and where to go.
		r := <-direct
		if r.status != http.StatusServiceUnavailable || r.code() != "shutting_down" {
			t.Fatalf("the long-poll at the member stopping: %d %s %v", r.status, r.raw, r.err)
		}
		nl, _ := waitServing(t, c, 20*time.Second, lead)
		if e, _ := r.body["error"].(map[string]any); e["active"] != c.Member(nl).Addr() {
			t.Fatalf("503 names %v, want the new active %s", e["active"], c.Member(nl).Addr())
		}
		if err := <-done; err != nil {
			t.Fatalf("the stopped member: %v", err)
		}
		// Through another member: sent on to the successor, still
		// waiting there behind the holder, which kept its lock.
		w.waitWaiters(at(nl), "ks", 1)
		if r := w.must(at(nl), "/v1/inspect", `{"key":"ks"}`, 200); tokenOf(t, r.str("token")) != tok {
			t.Fatalf("the holder's token after the handover: %s", r.raw)
		}
		w.must(at(nl), "/v1/release", `{"key":"ks","token":"`+strconv.FormatUint(tok, 10)+`"}`, 200)
		select {
		case r := <-viaOther:
			if r.status != 200 || tokenOf(t, r.str("token")) <= tok {
				t.Fatalf("the long-poll through member %d: %d %s %v", a, r.status, r.raw, r.err)
			}
			w.must(at(nl), "/v1/release", `{"key":"ks","token":"`+r.str("token")+`"}`, 200)
		case <-time.After(10 * time.Second):
			t.Fatal("the long-poll through another member was not granted after the release")
		}
		if r := w.must(at(nl), "/v1/inspect", `{"key":"ks"}`, 200); r.num("holders") != 0 || r.num("waiters") != 0 {
			t.Fatalf("at the end: %s", r.raw)
		}
	})
}

// settled waits until every member runs, agrees who serves and is in
// sync with it — in a priority cluster member 0, the highest priority,
// back in charge (it takes over once in sync); in a raft cluster every
// follower applied what the leader did — and returns who serves.
func settled(t *testing.T, c *clustertest.Cluster, mode string) int {
	t.Helper()
	_, err := c.WaitStatuses(30*time.Second, clustertest.Running(), func(sts []clustertest.Status) error {
		l, err := c.Agreed(sts)
		if err != nil {
			return err
		}
		if mode == clustertest.ModePriority && l != 0 {
			return fmt.Errorf("member %d serves, not member 0", l)
		}
		var applied uint64
		for _, st := range sts {
			if st.Index == l && st.Raft != nil {
				applied = st.Raft.AppliedIndex
			}
		}
		for _, st := range sts {
			switch {
			case st.Index == l:
			case !st.InSync:
				return fmt.Errorf("member %d is not in sync", st.Index)
			case st.Raft != nil && st.Raft.AppliedIndex < applied:
				return fmt.Errorf("member %d applied %d of %d", st.Index, st.Raft.AppliedIndex, applied)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the cluster did not settle within 30 s: %v", err)
	}
	l, _ := waitServing(t, c, 20*time.Second)
	return l
}

type errExit int

func (e errExit) Error() string { return "exit " + strconv.Itoa(int(e)) }

// readEvents sends each SSE event of r as [name, data] until r ends.
func readEvents(r io.Reader) <-chan [2]string {
	ch := make(chan [2]string, 8)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		var ev [2]string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "" && ev[0] != "":
				ch <- ev
				ev = [2]string{}
			case strings.HasPrefix(line, "event: "):
				ev[0] = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev[1] = line[6:]
			}
		}
	}()
	return ch
}

// decodeInto decodes a JSON answer with exact numbers.
func decodeInto(raw []byte, v *map[string]any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		*v = map[string]any{}
		return err
	}
	return nil
}
