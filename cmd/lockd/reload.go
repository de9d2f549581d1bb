package main

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reloaders are what SIGHUP re-reads (PROTOCOL.md §8.1, §8.2): each part
// that has files to re-read (the TLS material, the ACL file) adds a
// function, which keeps its old state when the new one does not load and
// says why in its error. The signal runs them all, in the order added, on
// one goroutine: a reload never overlaps another.
type reloaders struct {
	mu   sync.Mutex
	list []reloader
}

type reloader struct {
	name string
	fn   func() error
}

// add registers fn under name (for the log).
func (r *reloaders) add(name string, fn func() error) {
	r.mu.Lock()
	r.list = append(r.list, reloader{name, fn})
	r.mu.Unlock()
}

// run calls every function and logs each outcome.
func (r *reloaders) run(log *slog.Logger) {
	r.mu.Lock()
	list := append([]reloader(nil), r.list...)
	r.mu.Unlock()
	if len(list) == 0 {
		log.Info("SIGHUP: nothing to reload")
		return
	}
	for _, l := range list {
		if err := l.fn(); err != nil {
			log.Error("SIGHUP: reload failed: the one in force stays", "what", l.name, "err", err)
		} else {
			log.Info("SIGHUP: reloaded", "what", l.name)
		}
	}
}

// watch runs the reloaders on every SIGHUP until the returned stop is
// called (stop waits for a reload in progress).
func (r *reloaders) watch(log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range hup {
			r.run(log)
		}
	}()
	return func() {
		signal.Stop(hup)
		close(hup)
		<-done
	}
}
