package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockd-dev/lockd/api"
)

// The fault kinds the nemesis knows (-faults).
const (
	FaultKill      = "kill"      // kill -9 of a member, restart later
	FaultStop      = "stop"      // SIGSTOP past the failover timeout, then SIGCONT
	FaultPartition = "partition" // member links cut (isolation, all alone, one way); single: clients cut off
	FaultHandover  = "handover"  // SIGTERM (planned handover), restart later
	FaultDrop      = "drop"      // client connections reset
)

// AllFaults lists every fault kind, the default of -faults.
var AllFaults = []string{FaultKill, FaultStop, FaultPartition, FaultHandover, FaultDrop}

// Config is one run's configuration; every field is a flag.
type Config struct {
	Mode            string        // -mode: single, priority or raft
	Duration        time.Duration // -duration: how long the workload and the nemesis run
	Seed            uint64        // -seed: every random choice; 0 picks one
	JSON            bool          // -json: the report as JSON on stdout
	Workers         int           // -workers: client workers, each with its own client
	Keys            int           // -keys: how many keys they contend for
	SemWorkers      int           // -sem-workers: semaphore workers, beside the mutex ones (0: none)
	SemKeys         int           // -sem-keys: the semaphore keys they take permits of
	SemLimit        int           // -sem-limit: each semaphore key's permits
	Lease           time.Duration // -lease: the lease of every acquire and renew (whole seconds)
	FailoverTimeout time.Duration // -failover-timeout: the members' --failover-timeout
	Faults          []string      // -faults: the kinds the nemesis injects
	Interval        time.Duration // -interval: the mean pause between two injections
	MaxActive       int           // -max-active: faults in force at once
	Out             string        // -out: where histories, logs and visualizations go
	Binary          string        // -lockd: the lockd binary (default: built from this module)
	CheckTimeout    time.Duration // -check-timeout: porcupine's bound per key
	Verbose         bool          // -v: log every fault and phase on stderr
	Recheck         string        // -recheck: check this saved history.json again, run nothing
	// BigLocks is -big-locks: the held locks of the large-state phase,
	// run before the workload on a cluster of its own (0: no such phase).
	BigLocks int
	// BigFailover is -big-failover-timeout: that cluster's
	// --failover-timeout (short, so a snapshot takes many of them).
	BigFailover time.Duration
	Secure      bool // -secure: PROTOCOL.md §8 on (TLS everywhere, mutual TLS between members, a cluster secret)

	clientTLS *tls.Config // Secure: what the workload's clients need (set once the cluster runs)
}

// DefaultConfig returns the defaults of every flag (Mode has none).
func DefaultConfig() Config {
	return Config{
		Duration:        time.Minute,
		Workers:         6,
		Keys:            4,
		SemWorkers:      4,
		SemKeys:         1,
		SemLimit:        2,
		Lease:           3 * time.Second,
		FailoverTimeout: time.Second,
		Faults:          slices.Clone(AllFaults),
		Interval:        time.Second,
		MaxActive:       2,
		CheckTimeout:    2 * time.Minute,
		BigLocks:        DefaultBigLocks,
		BigFailover:     100 * time.Millisecond,
	}
}

// members is how many lockd processes the run starts: one node in single
// mode, a cluster of three otherwise.
func (c Config) members() int {
	if c.Mode == api.ModeSingle {
		return 1
	}
	return 3
}

// clientLocations is how many places the workers sit in: beside each
// member of a cluster; in single mode one beside the node and two across
// a network from it, so that a partition can cut some clients off.
const clientLocations = 3

// DefaultBigLocks is the default -big-locks: a million held locks.
const DefaultBigLocks = 1_000_000

// ErrUsage marks a bad command line (exit status 2).
var ErrUsage = errors.New("chaos: bad usage")

// Validate rejects a configuration a run cannot use, naming the flag.
func (c *Config) Validate() error {
	bad := func(flag, format string, args ...any) error {
		return fmt.Errorf("%w: -%s: %s", ErrUsage, flag, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Mode != api.ModeSingle && c.Mode != api.ModePriority && c.Mode != api.ModeRaft:
		return bad("mode", "%q: want single, priority or raft", c.Mode)
	case c.Secure && c.Mode == api.ModeSingle:
		// clustertest starts single nodes in plaintext only.
		return bad("secure", "needs -mode priority or raft")
	case c.Duration < time.Second || c.Duration > 24*time.Hour:
		return bad("duration", "%v: want 1s..24h", c.Duration)
	case c.Workers < 1 || c.Workers > 64:
		return bad("workers", "%d: want 1..64", c.Workers)
	case c.Keys < 1 || c.Keys > 1000:
		return bad("keys", "%d: want 1..1000", c.Keys)
	case c.SemWorkers < 0 || c.SemWorkers > 64:
		return bad("sem-workers", "%d: want 0..64", c.SemWorkers)
	case c.SemKeys < 1 || c.SemKeys > 1000:
		return bad("sem-keys", "%d: want 1..1000", c.SemKeys)
	case c.SemLimit < 1 || c.SemLimit > 65535:
		return bad("sem-limit", "%d: want 1..65535", c.SemLimit)
	case c.Lease < time.Second || c.Lease > 60*time.Second || c.Lease%time.Second != 0:
		return bad("lease", "%v: want whole seconds, 1s..60s", c.Lease)
	case c.FailoverTimeout < 100*time.Millisecond || c.FailoverTimeout > 10*time.Second:
		return bad("failover-timeout", "%v: want 100ms..10s", c.FailoverTimeout)
	case c.Interval < 10*time.Millisecond || c.Interval > time.Hour:
		return bad("interval", "%v: want 10ms..1h", c.Interval)
	case c.MaxActive < 1 || c.MaxActive > 8:
		return bad("max-active", "%d: want 1..8", c.MaxActive)
	case c.CheckTimeout < time.Second:
		return bad("check-timeout", "%v: want at least 1s", c.CheckTimeout)
	case c.BigLocks != 0 && (c.BigLocks < 1000 || c.BigLocks > 16_000_000):
		return bad("big-locks", "%d: want 0 (no large-state phase) or 1000..16000000", c.BigLocks)
	case c.BigFailover < 100*time.Millisecond || c.BigFailover > 10*time.Second:
		return bad("big-failover-timeout", "%v: want 100ms..10s", c.BigFailover)
	}
	if len(c.Faults) == 0 {
		return bad("faults", "empty: want some of %s, or none", strings.Join(AllFaults, ","))
	}
	for _, f := range c.Faults {
		if f == "none" && len(c.Faults) == 1 {
			continue
		}
		if !slices.Contains(AllFaults, f) {
			return bad("faults", "%q: want some of %s, or none", f, strings.Join(AllFaults, ","))
		}
	}
	return nil
}

// faultsOn reports whether the nemesis injects kind.
func (c *Config) faultsOn(kind string) bool { return slices.Contains(c.Faults, kind) }

// parseFlags reads the command line into a Config. Errors match ErrUsage
// (or are flag.ErrHelp).
func parseFlags(args []string, stderr io.Writer) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Mode, "mode", "", "mode: single (one node), priority or raft (a cluster of 3) (required)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the workload and the nemesis run (1s..24h)")
	seed := fs.String("seed", "0", "seed of every random choice (0: pick one; it is printed)")
	fs.BoolVar(&cfg.JSON, "json", false, "print the report as JSON on stdout")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "client workers, each with its own client (1..64)")
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "keys the workers contend for (1..1000)")
	fs.IntVar(&cfg.SemWorkers, "sem-workers", cfg.SemWorkers, "semaphore workers beside the others, each with its own client, taking permits (0..64; 0: no semaphore workload)")
	fs.IntVar(&cfg.SemKeys, "sem-keys", cfg.SemKeys, "semaphore keys the semaphore workers take permits of (1..1000)")
	fs.IntVar(&cfg.SemLimit, "sem-limit", cfg.SemLimit, "permits of each semaphore key (1..65535)")
	fs.DurationVar(&cfg.Lease, "lease", cfg.Lease, "lease of every acquire and renew (whole seconds, 1s..60s)")
	fs.DurationVar(&cfg.FailoverTimeout, "failover-timeout", cfg.FailoverTimeout, "the members' --failover-timeout (100ms..10s)")
	faults := fs.String("faults", strings.Join(cfg.Faults, ","), "fault kinds, comma-separated: "+strings.Join(AllFaults, ",")+", or none")
	fs.DurationVar(&cfg.Interval, "interval", cfg.Interval, "mean pause between two fault injections (10ms..1h)")
	fs.IntVar(&cfg.MaxActive, "max-active", cfg.MaxActive, "faults in force at once (1..8)")
	fs.StringVar(&cfg.Out, "out", "", "directory for the history, logs and visualizations (default: a temporary one, kept only when the run fails)")
	fs.StringVar(&cfg.Binary, "lockd", "", "the lockd binary (default: built from this module, with -race where possible)")
	fs.DurationVar(&cfg.CheckTimeout, "check-timeout", cfg.CheckTimeout, "bound of the linearizability search per key")
	fs.BoolVar(&cfg.Verbose, "v", false, "log every fault and phase on stderr")
	fs.BoolVar(&cfg.Secure, "secure", false, "run the members with TLS on every link, mutual TLS between members and a cluster secret (PROTOCOL.md §8); the clients use TLS")
	fs.StringVar(&cfg.Recheck, "recheck", "", "run the history checkers again on a saved history.json (with -mode and -failover-timeout as in its run); start nothing")
	fs.IntVar(&cfg.BigLocks, "big-locks", cfg.BigLocks, "held locks of the large-state phase, on a cluster of its own before the workload (0: no such phase; 1000..16000000)")
	fs.DurationVar(&cfg.BigFailover, "big-failover-timeout", cfg.BigFailover, "the --failover-timeout of the large-state phase's cluster (100ms..10s)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	s, err := strconv.ParseUint(*seed, 10, 64)
	if err != nil {
		return cfg, fmt.Errorf("%w: -seed: %q is not an unsigned integer", ErrUsage, *seed)
	}
	cfg.Seed = s
	cfg.Faults = nil
	for f := range strings.SplitSeq(*faults, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(cfg.Faults, f) {
			cfg.Faults = append(cfg.Faults, f)
		}
	}
	return cfg, cfg.Validate()
}

// Command is the command line that reruns c (the mode, the duration, the
// seed, and every flag that differs from its default).
func (c Config) Command() string {
	d := DefaultConfig()
	args := []string{"go", "run", "./chaos", "-mode", c.Mode, "-duration", c.Duration.String(), "-seed", strconv.FormatUint(c.Seed, 10)}
	add := func(differs bool, flag, value string) {
		if differs {
			args = append(args, "-"+flag, value)
		}
	}
	add(c.Workers != d.Workers, "workers", strconv.Itoa(c.Workers))
	add(c.Keys != d.Keys, "keys", strconv.Itoa(c.Keys))
	add(c.SemWorkers != d.SemWorkers, "sem-workers", strconv.Itoa(c.SemWorkers))
	add(c.SemKeys != d.SemKeys, "sem-keys", strconv.Itoa(c.SemKeys))
	add(c.SemLimit != d.SemLimit, "sem-limit", strconv.Itoa(c.SemLimit))
	add(c.Lease != d.Lease, "lease", c.Lease.String())
	add(c.FailoverTimeout != d.FailoverTimeout, "failover-timeout", c.FailoverTimeout.String())
	add(!slices.Equal(c.Faults, d.Faults), "faults", strings.Join(c.Faults, ","))
	add(c.Interval != d.Interval, "interval", c.Interval.String())
	add(c.MaxActive != d.MaxActive, "max-active", strconv.Itoa(c.MaxActive))
	add(c.CheckTimeout != d.CheckTimeout, "check-timeout", c.CheckTimeout.String())
	add(c.BigLocks != d.BigLocks, "big-locks", strconv.Itoa(c.BigLocks))
	add(c.BigFailover != d.BigFailover, "big-failover-timeout", c.BigFailover.String())
	add(c.Binary != "", "lockd", c.Binary)
	if c.Secure {
		args = append(args, "-secure")
	}
	return strings.Join(args, " ")
}
