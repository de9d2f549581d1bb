// Package wait is the tests' one way to wait for a condition that another
// goroutine or process makes true: poll it, bounded, and fail naming what
// was awaited. A test that sleeps and hopes, or polls with a loop of its
// own, either waits too long on a fast machine or fails on a loaded one.
//
// Only tests and the test harnesses (internal/clustertest,
// internal/lockdtest, repl/internal/repltest) import it. The client
// module's tests keep a copy of For: that module imports nothing of this
// one.
//
// wait may import only the standard library. It must not import lockd/...
// (internal/layers enforces both).
package wait
