package httpapi

import (
	"net/http"
	"testing"

	"github.com/lockd-dev/lockd/proto"
)

// TestStatusOf: every E code of PROTOCOL.md §3, §8.3 and §9 has its one
// documented status and code (docs/HTTP.md, "Answers and statuses"); E 1
// and a code the front does not know are its own mistake, 500.
func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		e      uint8
		status int
		code   string
	}{
		{proto.CodeBadFrame, http.StatusInternalServerError, CodeInternal},
		{proto.CodeBadKey, http.StatusBadRequest, CodeBadKey},
		{proto.CodeBadLease, http.StatusBadRequest, CodeBadLease},
		{proto.CodeShutdown, http.StatusServiceUnavailable, CodeShuttingDown},
		{proto.CodeUnauthenticated, http.StatusUnauthorized, CodeUnauthenticated},
		{proto.CodePermissionDenied, http.StatusForbidden, CodePermissionDenied},
		{proto.CodeLimitMismatch, http.StatusBadRequest, CodeLimitMismatch},
		{proto.CodeLimitReached, http.StatusTooManyRequests, CodeWatchLimit},
		{99, http.StatusInternalServerError, CodeInternal},
	} {
		if st, code := statusOf(c.e); st != c.status || code != c.code {
			t.Errorf("E %d: %d %s, want %d %s", c.e, st, code, c.status, c.code)
		}
	}
}
