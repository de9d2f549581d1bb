//go:build linux

// Command cycle measures lockd's handoff cycle on one key, broken down
// across the client and the server process (issue 22): two connections
// take turns on one key, each releasing it (and queueing again) as soon as
// its grant arrives, so every grant is a handoff caused by the other
// connection's release. For every handoff it reads four instants on one
// clock (CLOCK_REALTIME, which the kernel's receive timestamps use too):
//
//   - send: the client is about to write the release (write(2) called);
//   - sent: that write returned;
//   - rx: the grant reached the waiter's socket (the kernel's receive
//     timestamp, SO_TIMESTAMPNS, of the last segment the read returned);
//   - read: the waiter's read returned it to the client.
//
// and splits the cycle (one release to the next) into the server's part
// (send → the next rx: its wake-up, read, the table, a wake-up of the
// waiter's event loop if it is another one, and the grant's write), the
// client's wake-up (rx → read: netpoll and the scheduler) and the client's
// own work (read → the next send: parse and encode). sent − send is
// reported apart: on loopback the server's receive path runs inside the
// client's write, so it overlaps the server's part.
//
// Run it against a lockd started apart, e.g.
//
//	lockd --listen 127.0.0.1:7070 --loops 2 &
//	go run ./bench/cycle -addr 127.0.0.1:7070 -hops 100000
//
// It speaks the wire protocol with proto's frames only and drives the
// server from outside: cycle may import lockd/proto and the standard
// library. It must not import lockd/engine, lockd/client or lockd/admin
// (its test serves a lockd in process through internal/lockdtest).
// BENCHMARKS.md, "The handoff cycle across the client and the server", has
// its figures.
package main
