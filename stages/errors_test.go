package stages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestErrorKinds(t *testing.T) {
	// A real refused connection and a real server that hangs up without answering.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, refused := http.Get("http://" + addr + "/")
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	}))
	defer hangUp.Close()
	_, closed := http.Get(hangUp.URL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()

	for _, c := range []struct {
		name                 string
		err                  error
		transient, permanent bool
	}{
		{"nil", nil, false, false},
		{"plain", errors.New("boom"), false, false},
		{"marked transient", Transient(errors.New("service busy")), true, false},
		{"transient after", TransientAfter(errors.New("slow down"), time.Second), true, false},
		{"marked permanent", Permanent(errors.New("bad order")), false, true},
		{"permanent wins", Permanent(Transient(errors.New("x"))), false, true},
		{"connection refused", refused, true, false},
		{"closed before the answer", closed, true, false},
		{"deadline", ctx.Err(), true, false},
		{"wrapped reset", fmt.Errorf("calling: %w", syscall.ECONNRESET), true, false},
		{"dns", &net.DNSError{Err: "no such host", Name: "nowhere.invalid", IsNotFound: true}, true, false},
		{"file not found", &os.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, false, false},
		{"bare EOF", io.EOF, false, false},
	} {
		if got := IsTransient(c.err); got != c.transient {
			t.Errorf("%s: IsTransient(%v) = %v", c.name, c.err, got)
		}
		if got := IsPermanent(c.err); got != c.permanent {
			t.Errorf("%s: IsPermanent(%v) = %v", c.name, c.err, got)
		}
	}
	if d, ok := RetryAfter(fmt.Errorf("x: %w", TransientAfter(errors.New("y"), 3*time.Second))); !ok || d != 3*time.Second {
		t.Errorf("RetryAfter = %s, %v", d, ok)
	}
}
