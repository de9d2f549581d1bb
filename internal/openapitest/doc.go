// Package openapitest validates HTTP answers against an OpenAPI 3
// document, for the tests of the HTTP API (package httpapi, and the
// end-to-end tests that drive the lockd binary). It implements the
// subset of OpenAPI 3.0 that lockd's document uses — the standard
// library has no JSON Schema validator, and the subset is small: $ref
// (local), type (object, string, integer, array), properties, required,
// enum, pattern, minLength, minimum, maximum; response headers marked
// required; content by media type; and lockd's extension
// x-lockd-events, the schema of each Server-Sent Event's data.
//
// It is stricter than OpenAPI in one way, on purpose: an object whose
// properties are listed may carry no other, so an answer cannot grow a
// field the contract does not show. A path the document does not list
// must be answered 404 (components.responses.NotFound) and a method it
// does not list 405 (components.responses.MethodNotAllowed), as lockd's
// document says in its info.description.
//
// Only tests import it.
//
// openapitest may import only the standard library. It must not import
// lockd/... (it knows the document, not the server; internal/layers
// enforces both).
package openapitest
