// Package testcerts makes throwaway certificates for tests and the
// benchmark harness: a CA and the certificates it issues, ECDSA P-256,
// valid from an hour ago for a day, as crypto/tls values and as PEM files.
// Nothing here is for production use.
//
// testcerts may import only the standard library. It must not import
// lockd/... (internal/layers).
package testcerts
