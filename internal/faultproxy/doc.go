// Package faultproxy is a fault-injecting TCP proxy for tests, in the
// spirit of etcd's pkg/proxy and with no iptables dependency: a [Proxy]
// listens on one address and forwards every accepted connection to a
// target address, both ways, while the test breaks the path on demand.
//
// # What it owns
//
// The faults, each per direction ([Tx] is client → target, [Rx] is target
// → client, [Both] is both):
//
//   - [Proxy.Blackhole]: bytes are read and dropped, connections stay open
//     (a partition). A connection that lost bytes is reset when the
//     blackhole lifts, because TCP never delivers a stream with a gap: a
//     healed link never carries a corrupt stream, and new connections pass.
//     An end of stream (FIN) waits for the blackhole to lift.
//   - [Proxy.Pause] / [Proxy.Resume]: forwarding stops, what was read is
//     kept (at most a few chunks per direction and connection; the rest
//     waits in the kernel's buffers and the sender's window) and delivered
//     in order on resume.
//   - [Proxy.Delay]: every chunk is delivered no earlier than the latency
//     after it was read (a pipe with latency, not a throttle: chunks in
//     flight overlap).
//   - [Proxy.PauseAccept] / [Proxy.ResumeAccept]: new connections wait in
//     the kernel's accept queue (at most one already accepted is held).
//   - [Proxy.ResetAll]: every forwarded connection is closed with a reset.
//   - [Proxy.Heal] lifts every fault; [Proxy.Close] closes the listener
//     and every connection and returns once every goroutine has ended.
//
// Pause takes precedence over blackhole (held bytes are not dropped until
// the pause ends), and both over delay. A half-close (FIN) is forwarded as
// a half-close; a reset as a reset.
//
// # Concurrency
//
// Every method is safe for concurrent use, from any goroutine, including
// while traffic flows; a fault applies to the chunks forwarded after the
// call returns (chunks already written are not called back). A proxy runs
// one accept goroutine and four per forwarded connection (a reader and a
// writer per direction); Close waits for all of them. Memory is bounded:
// at most queueLen+2 chunks of chunkSize bytes per direction and
// connection.
//
// # Who uses it
//
// Only tests and the chaos command (through internal/clustertest, which
// puts proxies between cluster members). It is not part of lockd.
//
// # What it must not import
//
// faultproxy may import only the standard library. It must not import
// lockd/... (no package of the module; the layers test, internal/layers,
// enforces both).
package faultproxy
