package openapitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"mime"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Doc is a loaded OpenAPI document.
type Doc struct {
	root map[string]any
}

// Load parses an OpenAPI 3 document.
func Load(b []byte) (*Doc, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var root map[string]any
	if err := d.Decode(&root); err != nil {
		return nil, err
	}
	if v, _ := root["openapi"].(string); !strings.HasPrefix(v, "3.") {
		return nil, fmt.Errorf("openapi %q: want 3.x", v)
	}
	return &Doc{root: root}, nil
}

// resolve follows a $ref of the form #/a/b/c.
func (d *Doc) resolve(node map[string]any) (map[string]any, error) {
	for i := 0; i < 8; i++ {
		ref, ok := node["$ref"].(string)
		if !ok {
			return node, nil
		}
		if !strings.HasPrefix(ref, "#/") {
			return nil, fmt.Errorf("$ref %q: only local references", ref)
		}
		var cur any = d.root
		for _, part := range strings.Split(ref[2:], "/") {
			m, ok := cur.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("$ref %q does not resolve", ref)
			}
			cur = m[part]
		}
		next, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %q does not resolve", ref)
		}
		node = next
	}
	return nil, errors.New("$ref chain too long")
}

// response finds the documented response of method path status.
func (d *Doc) response(method, path string, status int) (map[string]any, error) {
	paths, _ := d.root["paths"].(map[string]any)
	item, ok := paths[path].(map[string]any)
	if !ok {
		// info.description: any path not listed is 404 not_found.
		if status != http.StatusNotFound {
			return nil, fmt.Errorf("path %s is not documented (and answered %d, not 404)", path, status)
		}
		return d.resolve(map[string]any{"$ref": "#/components/responses/NotFound"})
	}
	op, ok := item[strings.ToLower(method)].(map[string]any)
	if !ok && method == http.MethodHead {
		op, ok = item["get"].(map[string]any)
	}
	if !ok {
		// info.description: a method not listed is 405 method_not_allowed.
		if status != http.StatusMethodNotAllowed {
			return nil, fmt.Errorf("%s %s is not documented (and answered %d, not 405)", method, path, status)
		}
		return d.resolve(map[string]any{"$ref": "#/components/responses/MethodNotAllowed"})
	}
	rs, _ := op["responses"].(map[string]any)
	r, ok := rs[strconv.Itoa(status)].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s %s: status %d is not documented", method, path, status)
	}
	return d.resolve(r)
}

// Check validates one answer: its status, required headers and body (a
// stream's events, possibly cut short by the client).
func (d *Doc) Check(method, path string, status int, h http.Header, body []byte) error {
	r, err := d.response(method, path, status)
	if err != nil {
		return err
	}
	if hs, ok := r["headers"].(map[string]any); ok {
		for name, spec := range hs {
			s, _ := spec.(map[string]any)
			if req, _ := s["required"].(bool); req && h.Get(name) == "" {
				return fmt.Errorf("%s %s %d: header %s missing", method, path, status, name)
			}
		}
	}
	content, ok := r["content"].(map[string]any)
	if !ok {
		return nil
	}
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		return fmt.Errorf("%s %s %d: Content-Type %q: %v", method, path, status, h.Get("Content-Type"), err)
	}
	media, ok := content[mt].(map[string]any)
	if !ok {
		return fmt.Errorf("%s %s %d: content type %s is not documented", method, path, status, mt)
	}
	if mt == "text/event-stream" {
		events, _ := r["x-lockd-events"].(map[string]any)
		return d.checkEvents(events, body)
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("%s %s %d: body %q is not JSON: %v", method, path, status, body, err)
	}
	schema, _ := media["schema"].(map[string]any)
	if err := d.validate(schema, v, "body"); err != nil {
		return fmt.Errorf("%s %s %d: %v (body %s)", method, path, status, err, body)
	}
	return nil
}

// checkEvents validates an SSE stream (possibly cut short by the client):
// events of the documented names with valid data, watching first, at most
// one lost and nothing after it.
func (d *Doc) checkEvents(events map[string]any, stream []byte) error {
	evs, err := parseEvents(stream)
	if err != nil {
		return err
	}
	for i, e := range evs {
		if e.name == "" {
			continue // a comment (keep-alive)
		}
		spec, ok := events[e.name].(map[string]any)
		if !ok {
			return fmt.Errorf("event %q is not documented", e.name)
		}
		var v any
		dec := json.NewDecoder(strings.NewReader(e.data))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("event %s: data %q: %v", e.name, e.data, err)
		}
		if err := d.validate(spec, v, "event "+e.name); err != nil {
			return err
		}
		if (i == 0) != (e.name == "watching") {
			return fmt.Errorf("event %d is %s: the stream starts with watching, once", i, e.name)
		}
		if e.name == "lost" && i != len(evs)-1 {
			return fmt.Errorf("events after lost: %v", evs[i+1:])
		}
	}
	return nil
}

type event struct{ name, data string }

// parseEvents splits a stream into events (a comment is an event without
// a name); an incomplete last event is left out.
func parseEvents(stream []byte) ([]event, error) {
	var out []event
	var cur event
	sc := bufio.NewScanner(bytes.NewReader(stream))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			out = append(out, cur)
			cur = event{}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			cur.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			cur.data += line[len("data: "):]
		default:
			return nil, fmt.Errorf("SSE line %q: not event, data or a comment", line)
		}
	}
	return out, nil
}

func (d *Doc) validate(schema map[string]any, v any, at string) error {
	s, err := d.resolve(schema)
	if err != nil {
		return err
	}
	if enum, ok := s["enum"].([]any); ok {
		found := false
		for _, e := range enum {
			if fmt.Sprint(e) == fmt.Sprint(v) {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%s: %v is not one of %v", at, v, enum)
		}
	}
	switch t, _ := s["type"].(string); t {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an object", at, v)
		}
		props, closed := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		for _, r := range req {
			if _, ok := m[r.(string)]; !ok {
				return fmt.Errorf("%s: required %s missing", at, r)
			}
		}
		names := make([]string, 0, len(m))
		for k := range m {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			p, ok := props[k].(map[string]any)
			if !ok {
				if !closed {
					continue // an object without listed properties: any
				}
				return fmt.Errorf("%s: property %s is not documented", at, k)
			}
			if err := d.validate(p, m[k], at+"."+k); err != nil {
				return err
			}
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: %v is not a string", at, v)
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			return fmt.Errorf("%s: %q does not match %s", at, str, p)
		}
		if n, ok := s["minLength"].(json.Number); ok {
			if min, _ := n.Int64(); int64(len([]rune(str))) < min {
				return fmt.Errorf("%s: %q is shorter than %d", at, str, min)
			}
		}
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: %v is not a number", at, v)
		}
		x, ok := new(big.Int).SetString(string(n), 10)
		if !ok {
			return fmt.Errorf("%s: %v is not an integer", at, v)
		}
		for _, b := range []struct {
			key  string
			cmp  int
			what string
		}{{"minimum", -1, "below"}, {"maximum", 1, "above"}} {
			if lim, ok := s[b.key].(json.Number); ok {
				l, _ := new(big.Int).SetString(string(lim), 10)
				if x.Cmp(l) == b.cmp {
					return fmt.Errorf("%s: %v is %s %v", at, v, b.what, lim)
				}
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an array", at, v)
		}
		items, _ := s["items"].(map[string]any)
		for i, e := range a {
			if err := d.validate(items, e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case "":
	default:
		return fmt.Errorf("%s: schema type %q is not in the validator's subset", at, t)
	}
	return nil
}

// Transport returns an http.RoundTripper that validates every answer
// against doc, reporting mismatches with t.Errorf: a JSON body whole, a
// stream when it ends or is closed. A 431 is net/http's own (plain text)
// and is not checked.
func Transport(t testing.TB, doc *Doc, next http.RoundTripper) http.RoundTripper {
	return checking{t: t, doc: doc, next: next}
}

type checking struct {
	t    testing.TB
	doc  *Doc
	next http.RoundTripper
}

func (c checking) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	doc := c.doc
	path := req.URL.Path
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &streamCheck{t: c.t, doc: doc, method: req.Method, path: path, status: resp.StatusCode, h: resp.Header, rc: resp.Body}
		return resp, nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if resp.StatusCode == http.StatusRequestHeaderFieldsTooLarge {
		return resp, nil // net/http's own, documented in info.description
	}
	if err := doc.Check(req.Method, path, resp.StatusCode, resp.Header, body); err != nil {
		c.t.Errorf("answer does not match the OpenAPI document: %v", err)
	}
	return resp, nil
}

// streamCheck records a stream and validates it at its end or close. A
// test may close it while another goroutine reads it: mu guards buf.
type streamCheck struct {
	t      testing.TB
	doc    *Doc
	method string
	path   string
	status int
	h      http.Header
	rc     io.ReadCloser
	mu     sync.Mutex
	buf    bytes.Buffer
	once   sync.Once
}

func (s *streamCheck) Read(p []byte) (int, error) {
	n, err := s.rc.Read(p)
	s.mu.Lock()
	s.buf.Write(p[:n])
	s.mu.Unlock()
	if err != nil {
		s.verify()
	}
	return n, err
}

func (s *streamCheck) Close() error {
	s.verify()
	return s.rc.Close()
}

func (s *streamCheck) verify() {
	s.once.Do(func() {
		s.mu.Lock()
		b := bytes.Clone(s.buf.Bytes())
		s.mu.Unlock()
		if err := s.doc.Check(s.method, s.path, s.status, s.h, b); err != nil {
			s.t.Errorf("stream does not match the OpenAPI document: %v", err)
		}
	})
}
