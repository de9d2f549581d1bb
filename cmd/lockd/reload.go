package main

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reloaders is what SIGHUP re-reads: a small registry of named reload
// functions (the ACL file; TLS certificates join it the same way). Each
// reload either puts its new file in force or returns an error and keeps
// the one in force; a failure is logged and does not stop the others.
type reloaders struct {
	mu   sync.Mutex // a SIGHUP's reloads run one at a time
	list []reloader
}

type reloader struct {
	what   string // "--acl FILE", for the log
	reload func() error
}

// add registers a reload function under what (the flag and its file).
func (r *reloaders) add(what string, reload func() error) {
	r.list = append(r.list, reloader{what, reload})
}

// run runs every reload function in the order they were added.
func (r *reloaders) run(log *slog.Logger) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.list) == 0 {
		log.Info("SIGHUP: nothing to reload")
		return
	}
	for _, x := range r.list {
		if err := x.reload(); err != nil {
			log.Error("reload failed: the one in force stays", "what", x.what, "err", err)
			continue
		}
		log.Info("reloaded", "what", x.what)
	}
}

// onSIGHUP runs r on every SIGHUP until stop is closed. SIGHUP no longer
// ends the process (its default action): without anything to reload it is
// logged and ignored.
func (r *reloaders) onSIGHUP(log *slog.Logger, stop <-chan struct{}) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-hup:
				r.run(log)
			case <-stop:
				return
			}
		}
	}()
}
