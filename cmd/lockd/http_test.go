package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/wait"
)

// TestHTTPFlags: --http and its limits are checked at start like every
// address flag — exit 2 naming the flag, before anything is started or
// reserved (no data dir) — and the limits need --http.
func TestHTTPFlags(t *testing.T) {
	cluster := []string{"--cluster", "priority", "--listen", "127.0.0.1:7070", "--peers", "127.0.0.1:7070,127.0.0.1:7080"}
	cases := []struct {
		args []string
		env  []string
		want string
	}{
		{args: []string{"--http", "nocolon"}, want: "--http"},
		{args: []string{"--http", "127.0.0.1:70000"}, want: "--http"},
		{args: []string{"--http", "127.0.0.1:http"}, want: "--http"},
		{env: []string{"LOCKD_HTTP=127.0.0.1:x"}, want: "LOCKD_HTTP"},
		{args: []string{"--http-max-long-polls", "5"}, want: "--http-max-long-polls needs --http"},
		{args: []string{"--http-max-streams", "5"}, want: "--http-max-streams needs --http"},
		{args: []string{"--http-max-conns", "5"}, want: "--http-max-conns needs --http"},
		{args: []string{"--http", "127.0.0.1:0", "--http-max-conns", "0"}, want: "--http-max-conns 0"},
		{args: []string{"--http", "127.0.0.1:0", "--http-max-long-polls", "-1"}, want: "--http-max-long-polls -1"},
		{args: []string{"--http", "127.0.0.1:0", "--http-max-streams", "2000000"}, want: "--http-max-streams 2000000"},
		{args: []string{"--http", "127.0.0.1:7070", "--listen", "127.0.0.1:7070"}, want: "the same port as --listen"},
		{args: []string{"--http", "127.0.0.1:7071", "--listen", "127.0.0.1:7070", "--admin", "127.0.0.1:7071"}, want: "the same port as --admin"},
		{args: append([]string{"--http", "127.0.0.1:0"}, cluster...), want: "a cluster member needs a fixed HTTP port"},
		{args: append([]string{"--http", "127.0.0.1:7080"}, cluster...), want: "HTTP port 7080"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(append(tc.args, tc.env...), " "), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			var stderr bytes.Buffer
			cmd := exec.Command(binary, append(tc.args, "--data-dir", dir)...)
			cmd.Env = append(os.Environ(), tc.env...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want code 2; stderr: %s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr does not say %q: %s", tc.want, stderr.String())
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the data dir was made: something started; stderr: %s", stderr.String())
			}
		})
	}
}

var httpRE = regexp.MustCompile(`msg="http endpoint" addr=([0-9.:]+)`)

// TestHTTPOffByDefault: without --http there is no HTTP endpoint (no log
// line, which comes before the ready line when there is one); with
// LOCKD_HTTP there is, its metrics are in the admin endpoint's /metrics,
// and SIGTERM stops it with the rest (exit 0).
func TestHTTPOffByDefault(t *testing.T) {
	d := startDaemon(t, t.TempDir(), "--admin", "127.0.0.1:0")
	if strings.Contains(d.logs.String(), "http endpoint") {
		t.Fatalf("an HTTP endpoint without --http:\n%s", d.logs)
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}

	t.Setenv("LOCKD_HTTP", "127.0.0.1:0")
	d = startDaemon(t, t.TempDir(), "--admin", "127.0.0.1:0")
	line, err := d.WaitLog(httpRE, 0)
	if err != nil {
		t.Fatalf("no http endpoint line before the ready line: %v\n%s", err, d.logs)
	}
	addr := httpRE.FindStringSubmatch(line)[1]
	resp, err := http.Post("http://"+addr+"/v1/acquire", "application/json", strings.NewReader(`{"key":"k","lease_ms":5000}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"token":"`) {
		t.Fatalf("acquire: %d %s", resp.StatusCode, body)
	}
	// The count is taken when the handler returns, just after the answer
	// was written: read /metrics until it is there.
	const want = `lockd_http_requests_total{route="acquire",status="200"} 1`
	url := d.adminURL()
	var metrics string
	if err := wait.Until(5*time.Second, 10*time.Millisecond, func() error {
		r, err := http.Get(url + "/metrics")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if metrics = string(b); !strings.Contains(metrics, want) {
			return errors.New("not yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("/metrics has no HTTP request count (%v):\n%s", err, grepLines(metrics, "lockd_http"))
	}
	if code := d.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("the HTTP endpoint still accepts after the exit")
	}
}
