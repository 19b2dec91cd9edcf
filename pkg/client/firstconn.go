package client

import (
	"net/http"
	"net/http/httptrace"
	"sync"
)

// firstConn makes the requests a process starts before it has a
// connection wait for the first request's connection. client-go's HTTP/2
// transport would dial, and handshake TLS, once for each of them and then
// keep one connection: a plugin that reads two objects at once at its
// start would pay for two handshakes on both ends. After the first request
// has its connection (or has ended without one), requests pass straight
// through.
type firstConn struct {
	next http.RoundTripper

	pick  sync.Once
	open  sync.Once
	ready chan struct{}
}

func newFirstConn(next http.RoundTripper) *firstConn {
	return &firstConn{next: next, ready: make(chan struct{})}
}

func (f *firstConn) RoundTrip(r *http.Request) (*http.Response, error) {
	first := false
	f.pick.Do(func() { first = true })
	if !first {
		select {
		case <-f.ready:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
		return f.next.RoundTrip(r)
	}
	opened := func() { f.open.Do(func() { close(f.ready) }) }
	defer opened()
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { opened() }}
	return f.next.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
}

// WrappedRoundTripper lets client-go's transport wrappers see through.
func (f *firstConn) WrappedRoundTripper() http.RoundTripper { return f.next }
