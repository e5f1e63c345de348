package control

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// FuzzDecodeRequest checks the wire form and its validation: what
// DecodeRequest accepts encodes back to a line that decodes to the same
// request, and Validate judges any decoded request with an error of one line
// (the protocol's errors are one line, whatever names or text the request
// holds).
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"op":"ls"}`,
		`{"op":"create","name":"d","table":"0 8 zero","dir":"/tmp"}` + "\n",
		`{"op":"create","name":"d","notable":true,"uuid":"u","readonly":true}`,
		`{"op":"message","name":"d","sector":18446744073709551615,"args":["a","b"]}`,
		`{"op":"rename","name":"d","new_name":"e"}`,
		`{"op":"table","inactive":true}`,
		`{"op":"suspend","name":"d","noflush":true,"force":true}`,
		`{"op":"load","name":"d","table":"\u0000"}`,
		`{"op":"create","name":"a\nb"}`, `{"op":"rename","name":"d","new_name":"x\ny"}`,
		`{"op":"load","name":"d","table":"0 8 zero","dir":"rel\native"}`, `{"op":"frob\nnicate"}`,
		`{"op":1}`, `[]`, `null`, ``, "\n\n", `{"op":"ls"}{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err != nil {
			if req != nil {
				t.Fatal("request and error")
			}
			return
		}
		if err := req.Validate(); err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("%+v: error of more than one line: %q", req, err)
		}
		b, err := req.Encode()
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeRequest(b)
		if err != nil {
			t.Fatalf("re-encoded request %q: %v", b, err)
		}
		if !reflect.DeepEqual(req, again) {
			t.Fatalf("round trip changed %+v to %+v", req, again)
		}
	})
}

// FuzzReadRequest feeds arbitrary bytes, one at a time, to the control
// socket's stream reader: it accepts exactly what DecodeRequest accepts of
// the first line, and without a newline reports an incomplete request.
func FuzzReadRequest(f *testing.F) {
	for _, s := range []string{
		"{\"op\":\"ls\"}\n", "{\"op\":\"ls\"}", "{\"op\":\"ls\"}\n{\"op\":\"targets\"}\n", "\n",
		"{\"op\":\"create\",\"name\":\"d\",\"table\":\"0 8 zero\",\"dir\":\"/tmp\"}\nrest",
		"{\"op\":\"message\",\"name\":\"d\",\"args\":[\"a\\nb\"]}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ReadRequest(iotest.OneByteReader(bytes.NewReader(data)))
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if !errors.Is(err, ErrIncompleteRequest) {
				t.Fatalf("%q without a newline: %+v, %v; want an incomplete request", data, req, err)
			}
			return
		}
		want, werr := DecodeRequest(data[:i+1])
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: ReadRequest gives %v, DecodeRequest %v", data, err, werr)
		}
		if err == nil && !reflect.DeepEqual(req, want) {
			t.Fatalf("%q: ReadRequest %+v, DecodeRequest %+v", data, req, want)
		}
	})
}
