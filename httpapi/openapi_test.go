package httpapi_test

import (
	"sync"

	"github.com/lockd-dev/lockd/httpapi"
	"github.com/lockd-dev/lockd/internal/openapitest"
)

// served is the document the server serves, loaded once per test binary
// (TestRoutes checks that /v1/openapi.json is these bytes).
var served = sync.OnceValues(func() (*openapitest.Doc, error) { return openapitest.Load(httpapi.OpenAPI()) })
