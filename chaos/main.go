package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// The first SIGINT/SIGTERM ends the run early (it still heals, checks
	// and reports); a second one kills the command (the members die with
	// it: the harness gives them a parent-death signal).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// realMain runs the command and returns its exit status.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	var rep *Report
	if cfg.Recheck != "" {
		rep, err = Recheck(cfg)
	} else {
		rep, err = Run(ctx, cfg, stderr)
	}
	if errors.Is(err, ErrModeUnavailable) || errors.Is(err, ErrUsage) {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if rep == nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 1
	}
	if cfg.JSON {
		if err := rep.WriteJSON(stdout); err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return 1
		}
	} else {
		fmt.Fprint(stdout, rep.Text())
	}
	if !rep.Passed {
		if rep.Recheck == "" {
			fmt.Fprintf(stderr, "chaos: FAILED (seed %d); rerun with:\n    %s\n", rep.Seed, rep.Command)
		}
		return 1
	}
	return 0
}
