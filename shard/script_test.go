package shard

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	rewrite      = flag.Bool("rewrite", false, "rewrite the expected output of testdata/*.txt")
	checkLayouts = flag.Bool("layout", true, "check the table's layout after every transcript command")
)

// TestScripts runs the scenario transcripts in testdata/*.txt. Each command
// line is followed by "----" and the output it must produce, up to a blank
// line: the status, then the effects in order, then the records the Sink
// received in order. Lines starting with # are comments. Run with -rewrite
// to regenerate the outputs (then read the diff).
//
// Commands (durations as in time.ParseDuration; the clock starts at 0):
//
//	new [shards=N] [maxkeys=N] [perkey=N] [maxwaiters=N] [perconn=N] [start=N] [limit=N]
//	    [maxholders=N] [watches=N]
//	at DUR | advance DUR
//	acquire KEY [wait=N] lease=N owner=N [conn=NAME] [as=IDENT]
//	shared KEY [wait=N] lease=N owner=N limit=N [conn=NAME] [as=IDENT]
//	release KEY token=N [as=IDENT [admin=1]] [operator=1]
//	renew KEY lease=N token=N [as=IDENT [admin=1]]
//	validate KEY token=N (prints "valid left=DUR" or "not held")
//	watch KEY token=N [conn=NAME] (prints "watching", "not held" or "limit")
//	inspect KEY (prints holders, limit, waiters, the newest token, its time left)
//	detail KEY (every holder and every waiter, in order)
//	tick | cancel | move | endwatches | stats | held | dropconn NAME
//	dropwaiters NAME max=N (prints "done" or "more left")
//	waiters NAME (the conn's queued acquires and watches)
//	restore KEY token=N deadline=DUR [as=IDENT] [limit=N]
//	lookup KEY
//
// as= names the identity of an acquire (its grant's) or of a release or
// renew (PROTOCOL.md §8.3); without it there is none. A release or renew
// with as= prints "forced" or "refused" and the grant's identity when it
// was another's; identities show as ident=NAME in lookups, held keys and
// grant records. operator=1 is a release by the admin endpoint
// (Who.Operator). A shared key's grant records, held holders and lookups
// show its limit=N; stats shows holders= and watches= when not zero.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type scriptEnv struct {
	t       *testing.T
	tab     *Table
	now     int64
	conns   map[string]*Conn
	records []string
	out     Out
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	env := &scriptEnv{t: t}
	env.reset(nil)
	var rewritten strings.Builder
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			rewritten.WriteString(line + "\n")
			continue
		}
		cmdLine := i + 1
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without ----", path, cmdLine)
		}
		i += 2
		var want []string
		for ; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		got := env.run(line)
		rewritten.WriteString(line + "\n----\n")
		for _, g := range got {
			rewritten.WriteString(g + "\n")
		}
		if i < len(lines) {
			rewritten.WriteString("\n")
		}
		if !*rewrite && strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, cmdLine, line,
				strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(rewritten.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (env *scriptEnv) reset(args map[string]string) {
	cfg := Config{
		Shards:            env.intArg(args, "shards", 4),
		MaxKeys:           env.intArg(args, "maxkeys", 0),
		MaxWaitersPerKey:  env.intArg(args, "perkey", 0),
		MaxWaiters:        env.intArg(args, "maxwaiters", 0),
		MaxWaitersPerConn: env.intArg(args, "perconn", 0),
		MaxHolders:        env.intArg(args, "maxholders", 0),
		MaxWatchesPerConn: env.intArg(args, "watches", 0),
		Tick:              10 * time.Millisecond,
		Sink:              env.sink,
	}
	start := uint64(env.intArg(args, "start", 0))
	limit := uint64(env.intArg(args, "limit", 1<<40))
	tab, err := New(cfg, NewTokens(start, limit))
	if err != nil {
		env.t.Fatal(err)
	}
	env.tab, env.now, env.conns, env.records = tab, 0, map[string]*Conn{}, nil
}

func (env *scriptEnv) sink(r Record) {
	s := fmt.Sprintf("record %s %s token=%d", r.Kind, r.Key, r.Token)
	if r.Kind == RecordGrant || r.Kind == RecordRenew {
		s += fmt.Sprintf(" lease=%d deadline=%s", r.Lease, time.Duration(r.Deadline))
	}
	if len(r.Ident) > 0 {
		s += " ident=" + string(r.Ident)
	}
	if r.Limit != 0 {
		s += fmt.Sprintf(" limit=%d", r.Limit)
	}
	env.records = append(env.records, s)
}

func (env *scriptEnv) intArg(args map[string]string, name string, def int) int {
	v, ok := args[name]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		env.t.Fatalf("bad %s=%q", name, v)
	}
	return n
}

func (env *scriptEnv) durArg(s string) int64 {
	d, err := time.ParseDuration(s)
	if err != nil {
		env.t.Fatalf("bad duration %q", s)
	}
	return int64(d)
}

func (env *scriptEnv) conn(name string) *Conn {
	if name == "" || name == "-" {
		return nil
	}
	c := env.conns[name]
	if c == nil {
		c = NewConn(name)
		env.conns[name] = c
	}
	return c
}

func connName(c *Conn) string {
	if c == nil {
		return "-"
	}
	return c.Tag.(string)
}

// run executes one command and returns its output lines.
func (env *scriptEnv) run(line string) []string {
	f := strings.Fields(line)
	cmd, pos, args := f[0], []string{}, map[string]string{}
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	key := func() []byte {
		if len(pos) == 0 {
			env.t.Fatalf("%s: missing key", line)
		}
		return []byte(pos[0])
	}
	u64 := func(name string) uint64 { return uint64(env.intArg(args, name, 0)) }
	who := func() Who {
		return Who{Ident: env.tab.Ident([]byte(args["as"])), Admin: args["admin"] == "1", Operator: args["operator"] == "1"}
	}
	left := func(deadline int64) string { return time.Duration(deadline - env.now).String() }
	u8 := func(name string) uint8 { return uint8(env.intArg(args, name, 0)) }
	env.out.Reset()
	env.records = env.records[:0]
	var res []string
	tab := env.tab
	switch cmd {
	case "new":
		env.reset(args)
	case "at":
		env.now = env.durArg(pos[0])
	case "advance":
		env.now += env.durArg(pos[0])
	case "acquire":
		st, tok := tab.AcquireAs(env.now, key(), u8("wait"), u8("lease"), u64("owner"), who().Ident, env.conn(args["conn"]), &env.out)
		if st == Granted {
			res = append(res, fmt.Sprintf("%s token=%d", st, tok))
		} else {
			res = append(res, st.String())
		}
	case "shared":
		st, tok := tab.AcquireShared(env.now, key(), u8("wait"), u8("lease"), u64("owner"), uint16(u64("limit")), who().Ident, env.conn(args["conn"]), &env.out)
		if st == Granted {
			res = append(res, fmt.Sprintf("%s token=%d", st, tok))
		} else {
			res = append(res, st.String())
		}
	case "validate":
		if dl, ok := tab.Validate(env.now, key(), u64("token"), &env.out); ok {
			res = append(res, "valid left="+left(dl))
		} else {
			res = append(res, "not held")
		}
	case "watch":
		switch st := tab.Watch(env.now, key(), u64("token"), env.conn(args["conn"]), &env.out); st {
		case Watching:
			res = append(res, "watching")
		case WatchNotHeld:
			res = append(res, "not held")
		default:
			res = append(res, st.String())
		}
	case "inspect":
		in := tab.Inspect(env.now, key(), &env.out)
		s := fmt.Sprintf("holders=%d limit=%d waiters=%d", in.Holders, in.Limit, in.Waiters)
		if in.Holders > 0 {
			s += fmt.Sprintf(" token=%d left=%s", in.Token, left(in.Deadline))
		}
		res = append(res, s)
	case "detail":
		d := tab.Detail(key())
		res = append(res, fmt.Sprintf("limit=%d shared=%v", d.Limit, d.Shared))
		for _, h := range d.Holders {
			res = append(res, fmt.Sprintf("  holder token=%d deadline=%s lease=%d", h.Token, time.Duration(h.Deadline), h.Lease)+identArg([]byte(h.Ident)))
		}
		for _, w := range d.Waiters {
			res = append(res, fmt.Sprintf("  waiter owner=%d limit=%d deadline=%s lease=%d", w.Owner, w.Limit, time.Duration(w.Deadline), w.Lease)+identArg([]byte(w.Ident)))
		}
	case "endwatches":
		tab.EndWatches(&env.out)
	case "release":
		if _, ok := args["as"]; !ok && args["operator"] != "1" {
			res = append(res, answer(tab.Release(env.now, key(), u64("token"), &env.out), "released"))
			break
		}
		r, holder := tab.ReleaseAs(env.now, key(), u64("token"), who(), &env.out)
		res = append(res, judged(tab, r, holder, "released"))
	case "renew":
		if _, ok := args["as"]; !ok {
			res = append(res, answer(tab.Renew(env.now, key(), u8("lease"), u64("token"), &env.out), "renewed"))
			break
		}
		r, holder := tab.RenewAs(env.now, key(), u8("lease"), u64("token"), who(), &env.out)
		res = append(res, judged(tab, r, holder, "renewed"))
	case "tick":
		tab.Tick(env.now, &env.out)
	case "cancel":
		tab.CancelWaiters(&env.out)
	case "move":
		tab.MoveWaiters(&env.out)
	case "extend":
		tab.Tokens().Extend(u64("limit"))
	case "dropconn":
		tab.DropConn(env.conn(pos[0]))
	case "dropwaiters":
		if tab.DropWaiters(env.conn(pos[0]), env.intArg(args, "max", 0)) {
			res = append(res, "done")
		} else {
			res = append(res, "more left")
		}
	case "waiters":
		c := env.conn(pos[0])
		s := fmt.Sprintf("waiters=%d", c.Waiters())
		if n := c.Watches(); n > 0 {
			s += fmt.Sprintf(" watches=%d", n)
		}
		res = append(res, s)
	case "restore":
		h := HeldLock{Key: key(), Token: u64("token"), Deadline: env.durArg(args["deadline"]), Ident: []byte(args["as"]), Limit: uint16(u64("limit"))}
		if err := tab.RestoreHolder(&h); err != nil {
			res = append(res, "error: "+err.Error())
		} else {
			res = append(res, "ok")
		}
	case "lookup":
		ki := tab.Lookup(key())
		if !ki.Held {
			res = append(res, "free")
		} else {
			s := fmt.Sprintf("held token=%d deadline=%s waiters=%d", ki.Token, time.Duration(ki.Deadline), ki.Waiters) + identArg([]byte(ki.Ident))
			if ki.Limit != 0 {
				s += fmt.Sprintf(" holders=%d limit=%d", ki.Holders, ki.Limit)
			}
			res = append(res, s)
		}
	case "stats":
		st := tab.Stats()
		s := fmt.Sprintf("keys=%d waiters=%d", st.Keys, st.Waiters)
		if st.Holders != 0 || st.Watches != 0 {
			s += fmt.Sprintf(" holders=%d watches=%d", st.Holders, st.Watches)
		}
		res = append(res, s)
	case "held":
		var held []string
		for i := range tab.Shards() {
			tab.Dump(i, func(h *HeldLock) {
				s := fmt.Sprintf("held %s token=%d deadline=%s", h.Key, h.Token, time.Duration(h.Deadline)) + identArg(h.Ident)
				if h.Limit != 0 {
					s += fmt.Sprintf(" limit=%d", h.Limit)
				}
				held = append(held, s)
			})
		}
		slices.Sort(held) // shard order is an implementation detail
		res = append(res, held...)
	default:
		env.t.Fatalf("unknown command %q", line)
	}
	for _, e := range env.out.Effects {
		s := fmt.Sprintf("effect %s %s conn=%s owner=%d", e.Kind, e.Key, connName(e.Conn), e.Owner)
		switch e.Kind {
		case EffectGrant:
			s += fmt.Sprintf(" token=%d", e.Token)
		case EffectLost:
			s = fmt.Sprintf("effect lost %s conn=%s token=%d reason=%s", e.Key, connName(e.Conn), e.Token, e.Reason)
		}
		res = append(res, s)
	}
	if *checkLayouts {
		checkLayout(env.t, env.tab)
	}
	return append(res, env.records...)
}

// identArg shows an identity, if any.
func identArg(name []byte) string {
	if len(name) == 0 {
		return ""
	}
	return " ident=" + string(name)
}

// judged shows an identity-bound release's or renew's result.
func judged(tab *Table, r Result, holder Ident, yes string) string {
	switch r {
	case ResultOK:
		return yes
	case ResultForced:
		return yes + " forced holder=" + string(tab.IdentName(holder))
	case ResultRefused:
		return "not held refused holder=" + string(tab.IdentName(holder))
	}
	return "not held"
}

func answer(ok bool, yes string) string {
	if ok {
		return yes
	}
	return "not held"
}
