//go:build race

package engine_test

// raceEnabled scales the heaviest loads down under the race detector.
const raceEnabled = true
