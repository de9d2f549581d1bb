// Package freeport hands tests and harnesses the ports their servers
// will listen on: free when picked, outside the kernel's ephemeral range
// (where outgoing connections and ":0" listeners take their ports, so
// nothing else takes one between the pick and the bind), and never
// handed out twice in one process (so tests running in parallel, and the
// members of one cluster, do not collide). freeport may import only the
// standard library. It must not import lockd/... (internal/layers
// enforces both).
package freeport
