package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/api"
)

// decodeStrict decodes out into v, refusing fields v does not have.
func decodeStrict(t *testing.T, what, out string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v in %q", what, err, out)
	}
}

// TestValidate: a current token is valid with its lease left (text and
// JSON); a released one, or another key's, is exit 13.
func TestValidate(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	out, errs, code := ctl(t, env, "acquire", "v-key", "--lease", "20s")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	tok := strings.TrimSpace(out)
	out, errs, code = ctl(t, env, "validate", "v-key", tok)
	if code != 0 || !strings.HasPrefix(out, "valid: lease left ") {
		t.Fatalf("validate: %d %q %s", code, out, errs)
	}
	out, _, code = ctl(t, env, "validate", "v-key", tok, "-o", "json")
	var v validJSON
	decodeStrict(t, "validate -o json", out, &v)
	if code != 0 || !v.Valid || v.Token != tok || v.Key != "v-key" || v.LeaseLeftMs < 15000 || v.LeaseLeftMs > 20000 {
		t.Fatalf("validate -o json: %d %+v", code, v)
	}
	if _, errs, code := ctl(t, env, "validate", "other-key", tok); code != exitNotHeld || !strings.Contains(errs, "not held") {
		t.Fatalf("validate of another key: %d %s", code, errs)
	}
	if _, errs, code := ctl(t, env, "release", "v-key", tok); code != 0 {
		t.Fatalf("release: %d %s", code, errs)
	}
	if _, errs, code := ctl(t, env, "validate", "v-key", tok); code != exitNotHeld {
		t.Fatalf("validate after release: %d %s", code, errs)
	}
	for _, args := range [][]string{{"validate", "k"}, {"validate", "k", "x"}, {"validate", "k", "1", "2"}} {
		if _, errs, code := ctl(t, env, args...); code != exitUsage {
			t.Errorf("%v: exit %d %s, want 2", args, code, errs)
		}
	}
}

// TestInspect: lockd's I (holders, limit, waiters, the newest token), and
// with --admin every holder and waiter.
func TestInspect(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	out, errs, code := ctl(t, env, "inspect", "i-key")
	if code != 0 || !strings.Contains(out, "state:      free") {
		t.Fatalf("inspect of a free key: %d %q %s", code, out, errs)
	}
	out, _, _ = ctl(t, env, "acquire", "i-key", "--lease", "30s")
	tok := strings.TrimSpace(out)
	// A waiter: an acquire that queues behind the holder.
	waiter := exec.Command(lockctlBin, "acquire", "i-key", "--wait", "20s")
	waiter.Env = append(os.Environ(), env...)
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = waiter.Process.Kill(); _ = waiter.Wait() }()
	var doc inspectJSON
	deadline := time.Now().Add(5 * time.Second)
	for doc.Waiters == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no waiter after 5 s: %+v", doc)
		}
		out, errs, code = ctl(t, env, "inspect", "i-key", "-o", "json")
		if code != 0 {
			t.Fatalf("inspect -o json: %d %s", code, errs)
		}
		doc = inspectJSON{}
		decodeStrict(t, "inspect -o json", out, &doc)
		time.Sleep(10 * time.Millisecond)
	}
	if doc.Source != "lockd" || doc.Holders != 1 || doc.Limit != 1 || doc.Waiters != 1 || doc.Token != tok || doc.LeaseLeftMs <= 0 || doc.HolderList != nil {
		t.Fatalf("inspect -o json: %+v", doc)
	}
	out, errs, code = ctl(t, env, "inspect", "i-key")
	if code != 0 || !strings.Contains(out, "holders:    1") || !strings.Contains(out, "waiters:    1") || !strings.Contains(out, tok) {
		t.Fatalf("inspect: %d %q %s", code, out, errs)
	}
	out, errs, code = ctl(t, append(env, "LOCKD_ADMIN="+s.admin), "inspect", "i-key", "-o", "json")
	if code != 0 {
		t.Fatalf("inspect --admin: %d %s", code, errs)
	}
	doc = inspectJSON{}
	decodeStrict(t, "inspect --admin -o json", out, &doc)
	if doc.Source != "admin" || doc.Holders != 1 || doc.Limit != 1 || doc.Waiters != 1 || doc.Token != tok || doc.Shared == nil || *doc.Shared ||
		len(doc.HolderList) != 1 || doc.HolderList[0].Token != tok || len(doc.Queue) != 1 || doc.Queue[0].Shared || doc.Queue[0].WaitLeftMs <= 0 {
		t.Fatalf("inspect --admin: %+v", doc)
	}
	out, errs, code = ctl(t, append(env, "LOCKD_ADMIN="+s.admin), "inspect", "i-key")
	if code != 0 || !strings.Contains(out, "holder    token "+tok) || !strings.Contains(out, "waiter 1  exclusive") {
		t.Fatalf("inspect --admin: %d %q %s", code, out, errs)
	}
}

// TestWatch: watch waits for the grant's end and says how (released,
// forced); a token not held is exit 13; --wait passing is exit 10.
func TestWatch(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	acquire := func(key string) string {
		t.Helper()
		out, errs, code := ctl(t, env, "acquire", key, "--lease", "30s")
		if code != 0 {
			t.Fatalf("acquire: %d %s", code, errs)
		}
		return strings.TrimSpace(out)
	}
	// watchBG starts a watch and returns what waits for its end.
	watchBG := func(args ...string) func() (watchJSON, int, string) {
		cmd := exec.Command(lockctlBin, append([]string{"watch"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		var out, errb syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return func() (watchJSON, int, string) {
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("watch %v did not end: %s", args, errb.String())
			}
			var w watchJSON
			decodeStrict(t, "watch -o json", out.String(), &w)
			return w, cmd.ProcessState.ExitCode(), errb.String()
		}
	}
	// waitWatched waits until lockd counts a watch: the watch command has
	// registered (the only watch on this lockd).
	waitWatched := func(key, tok string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); watchesOf(t, s.admin) == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no watch of %s %s registered within 5 s", key, tok)
			}
		}
	}

	tok := acquire("w-rel")
	end := watchBG("w-rel", tok, "-o", "json")
	waitWatched("w-rel", tok)
	if _, errs, code := ctl(t, env, "release", "w-rel", tok); code != 0 {
		t.Fatalf("release: %d %s", code, errs)
	}
	if w, code, errs := end(); code != 0 || !w.Ended || w.Reason != "released" || w.Token != tok {
		t.Fatalf("watch of a released grant: %d %+v %s", code, w, errs)
	}

	tok = acquire("w-forced")
	end = watchBG("w-forced", tok, "-o", "json")
	waitWatched("w-forced", tok)
	req, _ := http.NewRequest(http.MethodDelete, "http://"+s.admin+api.PathKeys+"w-forced", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if w, code, errs := end(); code != 0 || w.Reason != "forced" {
		t.Fatalf("watch of a forced release: %d %+v %s", code, w, errs)
	}

	tok = acquire("w-wait")
	start := time.Now()
	out, errs, code := ctl(t, env, "watch", "w-wait", tok, "--wait", "300ms")
	if code != exitTimeout || !strings.Contains(out, "still held") || !strings.Contains(errs, "still held") {
		t.Fatalf("watch --wait: %d %q %s", code, out, errs)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("watch --wait 300ms took %v", el)
	}
	if _, errs, code := ctl(t, env, "watch", "w-wait", "12345"); code != exitNotHeld {
		t.Fatalf("watch of a token not held: %d %s", code, errs)
	}
	if _, errs, code := ctl(t, env, "watch", "w-wait", tok, "--wait", "-1s"); code != exitUsage {
		t.Fatalf("watch --wait -1s: %d %s", code, errs)
	}
}

// watchesOf is the number of watches lockd at admin counts, from its
// /metrics (lockd_watches).
func watchesOf(t *testing.T, admin string) int {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "lockd_watches" {
			n, _ := strconv.ParseFloat(f[1], 64)
			return int(n)
		}
	}
	t.Fatalf("no lockd_watches in /metrics")
	return 0
}

// TestRunShared: run --shared N runs at most N copies of the command at
// once (each marks itself in a directory while it runs and counts the
// marks); another N while the key is held is exit 17; a bad N is exit 2.
func TestRunShared(t *testing.T) {
	s := startLockd(t)
	env := []string{"LOCKD_ADDRS=" + s.addr}
	dir := t.TempDir()
	marks := filepath.Join(dir, "running")
	if err := os.Mkdir(marks, 0o755); err != nil {
		t.Fatal(err)
	}
	counts := filepath.Join(dir, "counts")
	script := fmt.Sprintf(`touch %[1]s/$$; ls %[1]s | wc -l >> %[2]s; sleep 0.4; rm %[1]s/$$`, marks, counts)
	const runs, limit = 6, 2
	var wg sync.WaitGroup
	errs := make([]string, runs)
	codes := make([]int, runs)
	for i := 0; i < runs; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i], codes[i] = ctl(t, env, "run", "r-shared", "--shared", strconv.Itoa(limit), "--wait", "30s", "--", "sh", "-c", script)
		}(i)
	}
	wg.Wait()
	for i := range codes {
		if codes[i] != 0 {
			t.Fatalf("run %d: exit %d %s", i, codes[i], errs[i])
		}
	}
	b, err := os.ReadFile(counts)
	if err != nil {
		t.Fatal(err)
	}
	seen := strings.Fields(string(b))
	peak := 0
	for _, f := range seen {
		n, _ := strconv.Atoi(f)
		peak = max(peak, n)
	}
	if len(seen) != runs || peak > limit {
		t.Fatalf("counts of running copies %v: want %d runs, never more than %d at once", seen, runs, limit)
	}
	if peak < limit {
		t.Fatalf("counts %v: never %d at once (6 runs of 400 ms started together)", seen, limit)
	}

	// Held with limit 2; a run with limit 3 is refused at once.
	holder := exec.Command(lockctlBin, "run", "r-shared", "--shared", "2", "--", "sleep", "30")
	holder.Env = append(os.Environ(), env...)
	var herr bytes.Buffer
	holder.Stderr = &herr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Process.Signal(os.Interrupt); _ = holder.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _, _ := ctl(t, env, "inspect", "r-shared", "-o", "json")
		var d inspectJSON
		if json.Unmarshal([]byte(out), &d) == nil && d.Holders == 1 {
			if d.Limit != 2 {
				t.Fatalf("inspect: %+v, want limit 2", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder did not take the key: %s", herr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, e, code := ctl(t, env, "run", "r-shared", "--shared", "3", "--wait", "5s", "--", "true")
	if code != exitLimitMismatch || !strings.Contains(e, "limit") {
		t.Fatalf("run --shared 3 on a key held with 2: %d %s", code, e)
	}
	for _, n := range []string{"-1", "65536", "x"} {
		if _, e, code := ctl(t, env, "run", "r-shared", "--shared", n, "--", "true"); code != exitUsage {
			t.Errorf("--shared %s: exit %d %s", n, code, e)
		}
	}
}

// TestRunStopsOnForcedRelease: an operator's forced release (the admin
// endpoint's DELETE) stops run's command at once, saying so.
func TestRunStopsOnForcedRelease(t *testing.T) {
	s := startLockd(t)
	started := filepath.Join(t.TempDir(), "started")
	cmd := exec.Command(lockctlBin, "run", "forced", "--addr", s.addr, "--lease", "9s", "--renew-every", "3s",
		"--margin", "1s", "--grace", "1s", "--", "sh", "-c", "touch "+started+"; sleep 60")
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("command did not start: %s", errb.String())
		}
	}
	for deadline := time.Now().Add(5 * time.Second); watchesOf(t, s.admin) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("run's watch not registered within 5 s")
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+s.admin+api.PathKeys+"forced", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	start := time.Now()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitLockLost {
			t.Fatalf("exit %v, want %d: %s", err, exitLockLost, errb.String())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("run did not stop: %s", errb.String())
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("stopped %v after the forced release", took)
	}
	if !strings.Contains(errb.String(), "by an operator") {
		t.Fatalf("stderr does not say why: %s", errb.String())
	}
}
