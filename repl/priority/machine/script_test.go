package machine

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt")

// TestScripts runs the transcripts in testdata/*.txt: clusters of
// machines on a fake clock (sim_test.go), driven by commands. Each command
// line is followed by "----" and the output it must produce, up to a blank
// line: what the members logged and every change of their gates, in
// order ("m1 info: …", "m0 gate redirect m1"), or the members' states.
// Lines starting with # are comments. Run with -rewrite to regenerate the
// outputs (then read the diff).
//
// Commands (durations as in time.ParseDuration):
//
//	cluster n=N timeout=DUR [stored=E,E,…] [delay=DUR] [wall=1]
//	             a new cluster of N members started now (stored: the
//	             epoch in each one's data dir; delay: every frame's;
//	             wall: promotions jump to the fake wall clock)
//	run DUR      the clock moves DUR in ticks of a tenth of the timeout
//	grant M N    member M, serving, makes N changes (its position and
//	             counter move by N)
//	stall M DUR  member M freezes for DUR (no tick; frames sent to it
//	             wait, and arrive in order when it resumes)
//	kill M | start M   M stops dead | restarts with its data dir
//	cut A B [both]     A's frames to B are lost (both ways)
//	heal         every cut ends
//	nosync M [off]     M's snapshots never complete (it refused, or its
//	             sync never ends): its table stays empty
//	lag M [off]  the stream to M stands still (its position stays)
//	stop M       Stop on member M
//	status       every member's role, epoch, gate and position
//	tokens       every member's allocator (counter, limit) and mark, and
//	             the fake wall clock
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var c *cluster
	var out strings.Builder
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		at := i + 1
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without ----", path, at)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		got := scriptCommand(t, &c, line, path, at)
		out.WriteString(line + "\n----\n")
		for _, g := range got {
			out.WriteString(g + "\n")
		}
		if i < len(lines) {
			out.WriteString("\n")
		}
		if !*rewrite && strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, at, line, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptCommand runs one command and returns its output.
func scriptCommand(t *testing.T, cp **cluster, line, path string, at int) []string {
	f := strings.Fields(line)
	cmd, args, pos := f[0], map[string]string{}, []string{}
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	bad := func(why string) { t.Fatalf("%s:%d: %s: %s", path, at, line, why) }
	num := func(k int) int {
		if k >= len(pos) {
			bad("missing argument")
		}
		n, err := strconv.Atoi(strings.TrimPrefix(pos[k], "m"))
		if err != nil {
			bad(err.Error())
		}
		return n
	}
	dur := func(s string) time.Duration {
		d, err := time.ParseDuration(s)
		if err != nil {
			bad(err.Error())
		}
		return d
	}
	if cmd == "cluster" {
		n, err := strconv.Atoi(args["n"])
		if err != nil {
			bad("n=")
		}
		var stored []uint64
		if s := args["stored"]; s != "" {
			for _, e := range strings.Split(s, ",") {
				v, err := strconv.ParseUint(e, 10, 64)
				if err != nil {
					bad(err.Error())
				}
				stored = append(stored, v)
			}
		}
		timeout := time.Second
		if s := args["timeout"]; s != "" {
			timeout = dur(s)
		}
		*cp = newCluster(t, n, timeout, stored...)
		if s := args["delay"]; s != "" {
			(*cp).delay = int64(dur(s))
		}
		if args["wall"] == "1" {
			(*cp).wall = true
			for _, s := range (*cp).ms {
				s.m.cfg.NoWallFloor = false
			}
		}
		return nil
	}
	c := *cp
	if c == nil {
		bad("no cluster yet")
	}
	c.logs = nil
	switch cmd {
	case "run":
		c.step(dur(pos[0]))
	case "grant":
		c.grant(num(0), uint64(num(1)))
	case "stall":
		c.ms[num(0)].stalled = c.now + int64(dur(pos[1])) + 1
	case "kill":
		c.ms[num(0)].down = true
	case "start":
		c.start(num(0))
	case "cut":
		a, b := num(0), num(1)
		c.cut[a][b] = true
		if len(pos) > 2 && pos[2] == "both" {
			c.cut[b][a] = true
		}
	case "heal":
		for i := range c.cut {
			clear(c.cut[i])
		}
	case "nosync":
		c.ms[num(0)].nosync = len(pos) < 2 || pos[1] != "off"
	case "lag":
		c.ms[num(0)].lagging = len(pos) < 2 || pos[1] != "off"
	case "stop":
		c.input(num(0), Msg{Kind: MsgStop})
	case "status":
		return c.status()
	case "tokens":
		out := []string{fmt.Sprintf("wall clock %d", c.now)}
		for i, s := range c.ms {
			if !s.down {
				out = append(out, fmt.Sprintf("m%d last=%d limit=%d mark=%d", i, s.last, s.limit, s.mark))
			}
		}
		return out
	default:
		bad("unknown command")
	}
	return c.logs
}
