package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzFastDecode: a body fastDecode takes is one json.Unmarshal decodes
// to the same fields.
func FuzzFastDecode(f *testing.F) {
	for _, s := range []string{
		`{"key":"a","lease_ms":1000}`, `{"key":"a","wait_ms":0,"lease_ms":1,"limit":3}`, ` { "key" : "é/x y" , "token" : "12" } `,
		`{"key":"a","token":"1","lease_ms":2000}`, `{"key":"a\u0041"}`, `{"key":null}`, `{"KEY":"a"}`, `{"key":"a","key":"b"}`,
		`{"lease_ms":01}`, `{"lease_ms":1.5}`, `{"lease_ms":-1}`, `{}`, `{"key":"a"}x`, "{\"key\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, mk := range []func() any{func() any { return &acquireBody{} }, func() any { return &tokenBody{} }, func() any { return &keyBody{} }} {
			fast, slow := mk(), mk()
			if !fastDecode(body, fast) {
				continue
			}
			if err := json.Unmarshal(body, slow); err != nil {
				t.Fatalf("fastDecode took %q into %T; json.Unmarshal: %v", body, fast, err)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("%q into %T: fastDecode %s, json.Unmarshal %s", body, fast, dump(fast), dump(slow))
			}
		}
	})
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestFastDecodeTakesThePlainForm: the bodies clients send are decoded
// without encoding/json (the rest is FuzzFastDecode's).
func TestFastDecodeTakesThePlainForm(t *testing.T) {
	for _, tc := range []struct {
		body string
		v    any
		want bool
	}{
		{`{"key":"a/b c","wait_ms":0,"lease_ms":30000}`, &acquireBody{}, true},
		{`{"key":"a","lease_ms":30000,"limit":4}`, &acquireBody{}, true},
		{"{\n  \"key\": \"é\",\n  \"token\": \"18446744073709551615\"\n}\n", &tokenBody{}, true},
		{`{"key":"a","token":"7","lease_ms":1000}`, &tokenBody{}, true},
		{`{"key":"a"}`, &keyBody{}, true},
		{`{"key":"a\"b"}`, &keyBody{}, false},
		{`{"key":"a","extra":1}`, &keyBody{}, false},
		{`{"key":"a","token":7}`, &tokenBody{}, false},
		{`{"key":"a","lease_ms":null}`, &acquireBody{}, false},
	} {
		if got := fastDecode([]byte(tc.body), tc.v); got != tc.want {
			t.Errorf("fastDecode(%s) = %v, want %v", tc.body, got, tc.want)
		}
	}
}
