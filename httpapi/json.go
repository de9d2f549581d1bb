package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// Error codes: the "code" of the one error shape,
// {"error": {"code": …, "message": …}}. They are a contract (clients
// switch on them; openapi.json lists them): a code may be added, none is
// renamed or removed.
const (
	CodeBadRequest        = "bad_request"         // 400: not JSON, a field of the wrong type, a missing field
	CodeBadKey            = "bad_key"             // 400: E 2, or a key the wire cannot carry (over 1024 bytes, a newline)
	CodeBadLease          = "bad_lease"           // 400: E 3 (lease_ms 0), or lease_ms over 255000
	CodeBadWait           = "bad_wait"            // 400: wait_ms below 0 or over 255000 (a longer wait is the client's loop)
	CodeBadToken          = "bad_token"           // 400: a token that is not a decimal string of 1..20 digits below 2^64
	CodeBadLimit          = "bad_limit"           // 400: limit below 0 or over 65535
	CodeLimitMismatch     = "limit_mismatch"      // 400: E 7 (limit 0, or not the limit of the key's holders)
	CodeUnauthenticated   = "unauthenticated"     // 401: E 5
	CodePermissionDenied  = "permission_denied"   // 403: E 6
	CodeNotFound          = "not_found"           // 404: no such route
	CodeMethodNotAllowed  = "method_not_allowed"  // 405
	CodeRequestTimeout    = "request_timeout"     // 408: the body did not arrive within 10 s
	CodeTimeout           = "timeout"             // 409: T, or the request's wait_ms passed
	CodeNotHeld           = "not_held"            // 409: N
	CodeBodyTooLarge      = "body_too_large"      // 413
	CodeNotServing        = "not_serving"         // 421: a forwarded request met M (members only)
	CodeBusy              = "busy"                // 429: B
	CodeWatchLimit        = "watch_limit"         // 429: E 8
	CodeInternal          = "internal"            // 500: an answer the front did not expect
	CodeIndeterminate     = "indeterminate"       // 502: the request may or may not have been executed
	CodeShuttingDown      = "shutting_down"       // 503: E 4
	CodeNoActive          = "no_active"           // 503: M without an address until the deadline
	CodeUnavailable       = "unavailable"         // 503: no answer within the transport deadline; nothing changed
	CodeTooManyLongPolls  = "too_many_long_polls" // 503: --http-max-long-polls acquires are waiting
	CodeTooManyStreams    = "too_many_streams"    // 503: --http-max-streams watches are open
	CodeMoved             = "moved"               // 307: the body of a redirect to the serving member
	retryAfterSeconds     = "1"
	maxWireSeconds        = 255
	maxWireMillis         = maxWireSeconds * 1000
	contentTypeJSON       = "application/json"
	contentTypeEventsUTF8 = "text/event-stream; charset=utf-8"
)

// statusOf maps an E code (PROTOCOL.md §3, §8.3, §9.1) to its status and
// error code. E 1 is the front's own mistake: a frame it built wrong.
func statusOf(code uint8) (int, string) {
	switch code {
	case 2:
		return http.StatusBadRequest, CodeBadKey
	case 3:
		return http.StatusBadRequest, CodeBadLease
	case 4:
		return http.StatusServiceUnavailable, CodeShuttingDown
	case 5:
		return http.StatusUnauthorized, CodeUnauthenticated
	case 6:
		return http.StatusForbidden, CodePermissionDenied
	case 7:
		return http.StatusBadRequest, CodeLimitMismatch
	case 8:
		return http.StatusTooManyRequests, CodeWatchLimit
	}
	return http.StatusInternalServerError, CodeInternal
}

// appendString appends s as a JSON string. s is valid UTF-8 (the front
// refuses bodies that are not, and the engine's messages are ASCII).
func appendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendToken appends a token as a JSON string of decimal digits.
func appendToken(dst []byte, t uint64) []byte {
	dst = append(dst, '"')
	dst = strconv.AppendUint(dst, t, 10)
	return append(dst, '"')
}

// errorBody is the one error shape; active, when not "", names the
// serving member's client address (a 307 or 421).
func errorBody(code, msg, active string) []byte {
	b := make([]byte, 0, 64+len(msg))
	b = append(b, `{"error":{"code":`...)
	b = appendString(b, code)
	b = append(b, `,"message":`...)
	b = appendString(b, msg)
	if active != "" {
		b = append(b, `,"active":`...)
		b = appendString(b, active)
	}
	return append(b, "}}\n"...)
}

// Request bodies. Fields are pointers so that a missing field is told from
// a zero; integers are kept raw and read by millis (a float, a string or
// an integer out of range is refused with the field's code: encoding/json
// would take "5000", a string, into a json.Number).
// keyed is a request body with a key.
type keyed interface{ keyField() *string }

func (b *acquireBody) keyField() *string { return b.Key }
func (b *tokenBody) keyField() *string   { return b.Key }
func (b *keyBody) keyField() *string     { return b.Key }

// decodeKeyed decodes body into v and returns its key, checked.
func decodeKeyed(body []byte, v keyed) (string, error) {
	if err := decode(body, v); err != nil {
		return "", err
	}
	return checkKey(v.keyField())
}

type acquireBody struct {
	Key     *string          `json:"key"`
	WaitMs  *json.RawMessage `json:"wait_ms"`
	LeaseMs *json.RawMessage `json:"lease_ms"`
	Limit   *json.RawMessage `json:"limit"`
}

type tokenBody struct {
	Key     *string          `json:"key"`
	Token   *json.RawMessage `json:"token"`
	LeaseMs *json.RawMessage `json:"lease_ms"`
}

type keyBody struct {
	Key *string `json:"key"`
}

// badRequest is a request the front refuses before anything is sent to
// the engine: what the wire cannot express, ranked as PROTOCOL.md ranks a
// bad frame (before authentication). Nothing changes.
type badRequest struct {
	status int
	code   string
	msg    string
}

func (e *badRequest) Error() string { return e.msg }

func bad(code, msg string) *badRequest { return &badRequest{http.StatusBadRequest, code, msg} }

// decode parses body into v: UTF-8 JSON (a JSON text must be UTF-8, and a
// key must reach the engine byte for byte: encoding/json would replace
// invalid bytes), one object.
func decode(body []byte, v any) error {
	if fastDecode(body, v) {
		return nil
	}
	if !utf8.Valid(body) {
		return bad(CodeBadRequest, "the body is not UTF-8")
	}
	// Unmarshal refuses anything after the one value; the fields that
	// take numbers are json.Number, kept exact.
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return bad(codeOfField(te.Field), "field "+te.Field+": want "+wantOf(te.Field))
		}
		return bad(CodeBadRequest, "the body is not one JSON object: "+err.Error())
	}
	return nil
}

// codeOfField is the code of a field whose value has the wrong type.
func codeOfField(field string) string {
	switch field {
	case "key":
		return CodeBadKey
	case "wait_ms":
		return CodeBadWait
	case "lease_ms":
		return CodeBadLease
	case "limit":
		return CodeBadLimit
	case "token":
		return CodeBadToken
	}
	return CodeBadRequest
}

func wantOf(field string) string {
	switch field {
	case "key":
		return "a string"
	case "token":
		return "a decimal string"
	}
	return "an integer"
}

// checkKey refuses a missing key and one the wire cannot carry (PROTOCOL.md
// §1: at most 1024 bytes, no 0x0A); the engine judges the rest (empty,
// longer than --max-key: E 2).
func checkKey(k *string) (string, error) {
	if k == nil {
		return "", bad(CodeBadKey, "key: missing")
	}
	if len(*k) > 1024 {
		return "", bad(CodeBadKey, "key: over 1024 bytes")
	}
	for i := 0; i < len(*k); i++ {
		if (*k)[i] == '\n' {
			return "", bad(CodeBadKey, "key: a key cannot contain a newline (0x0A)")
		}
	}
	return *k, nil
}

// millis reads an integer field of 0..max milliseconds; def when missing
// (required: missing is an error).
func millis(n *json.RawMessage, field, code string, max int64, required bool, def int64) (int64, error) {
	if n == nil {
		if required {
			return 0, bad(code, field+": missing")
		}
		return def, nil
	}
	v, err := strconv.ParseInt(string(*n), 10, 64) // a JSON integer: digits, maybe a minus
	if err != nil || v < 0 || v > max || (*n)[0] == '+' {
		return 0, bad(code, field+": want an integer 0.."+strconv.FormatInt(max, 10))
	}
	return v, nil
}

// leaseSeconds is the wire's lease for lease_ms: rounded up to whole
// seconds (a lease never ends before the holder was told it would).
func leaseSeconds(ms int64) uint8 { return uint8((ms + 999) / 1000) }

// parseToken reads a token: a JSON string of decimal digits below 2^64.
func parseToken(raw *json.RawMessage) (uint64, error) {
	if raw == nil {
		return 0, bad(CodeBadToken, "token: missing")
	}
	if r := *raw; len(r) >= 2 && r[0] == '"' && r[len(r)-1] == '"' && plainDigits(r[1:len(r)-1]) {
		return tokenOf(string(r[1 : len(r)-1]))
	}
	var s string
	if err := json.Unmarshal(*raw, &s); err != nil {
		return 0, bad(CodeBadToken, "token: want a decimal string (a JSON number loses digits above 2^53)")
	}
	return tokenOf(s)
}

// plainDigits reports whether b is only ASCII digits.
func plainDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func tokenOf(s string) (uint64, error) {
	if s == "" || len(s) > 20 || s[0] == '+' {
		return 0, bad(CodeBadToken, "token: want a decimal string below 2^64")
	}
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, bad(CodeBadToken, "token: want a decimal string below 2^64")
	}
	return t, nil
}

// fastDecode decodes the plain form of a request body — one object whose
// members are the fields of v (*acquireBody, *tokenBody or *keyBody),
// each at most once, named exactly, with a string without escapes or a
// non-negative integer as its value — into v, as json.Unmarshal would,
// without reflection. Anything else (escapes, other members, null,
// another type, bad JSON) is false and left to decode's json.Unmarshal,
// which also gives the errors. FuzzFastDecode checks it against
// json.Unmarshal.
//
// Values of json.RawMessage fields are slices of body (json.Unmarshal
// copies them); body outlives their use.
func fastDecode(body []byte, v any) bool {
	if !utf8.Valid(body) {
		return false
	}
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return false
	}
	i = skipSpace(body, i+1)
	var seen uint8
	if i < len(body) && body[i] == '}' {
		return skipSpace(body, i+1) == len(body)
	}
	for {
		name, j, ok := plainString(body, i)
		if !ok {
			return false
		}
		i = skipSpace(body, j)
		if i == len(body) || body[i] != ':' {
			return false
		}
		i = skipSpace(body, i+1)
		var val []byte
		isString := false
		if s, j, ok := plainString(body, i); ok {
			val, isString, i = s, true, j
		} else if j, ok := plainUint(body, i); ok {
			val, i = body[i:j], j
		} else {
			return false
		}
		var bit uint8
		switch v := v.(type) {
		case *acquireBody:
			switch string(name) {
			case "key":
				bit, ok = 1, setString(&v.Key, val, isString)
			case "wait_ms":
				bit, ok = 2, setNumber(&v.WaitMs, val, isString)
			case "lease_ms":
				bit, ok = 4, setNumber(&v.LeaseMs, val, isString)
			case "limit":
				bit, ok = 8, setNumber(&v.Limit, val, isString)
			default:
				return false
			}
		case *tokenBody:
			switch string(name) {
			case "key":
				bit, ok = 1, setString(&v.Key, val, isString)
			case "token":
				// A token is a string (a number is json.Unmarshal's to
				// take and parseToken's to refuse).
				bit, ok = 2, isString
				if ok {
					m := json.RawMessage(body[i-len(val)-2 : i])
					v.Token = &m
				}
			case "lease_ms":
				bit, ok = 4, setNumber(&v.LeaseMs, val, isString)
			default:
				return false
			}
		case *keyBody:
			if string(name) != "key" {
				return false
			}
			bit, ok = 1, setString(&v.Key, val, isString)
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		i = skipSpace(body, i)
		if i == len(body) {
			return false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return skipSpace(body, i+1) == len(body)
		default:
			return false
		}
	}
}

func setString(dst **string, val []byte, isString bool) bool {
	if !isString {
		return false
	}
	s := string(val)
	*dst = &s
	return true
}

func setNumber(dst **json.RawMessage, val []byte, isString bool) bool {
	if isString {
		return false
	}
	m := json.RawMessage(val)
	*dst = &m
	return true
}

// skipSpace skips JSON whitespace from i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at i without escapes or control
// characters: its contents and the index after its closing quote.
func plainString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// plainUint reads a JSON integer at i: 0, or 1-9 then digits (at most 18),
// ended by neither a digit nor a fraction or exponent.
func plainUint(b []byte, i int) (int, bool) {
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	n := j - i
	if n == 0 || n > 18 || (b[i] == '0' && n > 1) {
		return 0, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, false
	}
	return j, true
}
