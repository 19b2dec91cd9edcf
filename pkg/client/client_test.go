package client

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

func TestEveryRequestNamesTheProgramInItsUserAgent(t *testing.T) {
	agents := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		agents <- r.UserAgent()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	defer srv.Close()
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, _ = c.BGPAdvertisements("ns").Get(ctx, "x", metav1.GetOptions{})
	_, _ = c.Leases("ns").Get(ctx, "x", metav1.GetOptions{})
	for range 2 {
		if ua := <-agents; strings.HasPrefix(ua, "Go-http-client") || ua == "" {
			t.Errorf("user agent %q does not name the program", ua)
		}
	}
}

func TestRequestsStartedTogetherShareOneConnection(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	c, err := New(&rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, get := range []func() error{
		func() error { _, err := c.Leases("ns").Get(ctx, "x", metav1.GetOptions{}); return err },
		func() error { _, err := c.VPCAttachments("ns").Get(ctx, "x", metav1.GetOptions{}); return err },
		func() error { _, err := c.BGPAdvertisements("ns").Get(ctx, "x", metav1.GetOptions{}); return err },
	} {
		wg.Go(func() {
			<-start
			if err := get(); !apierrors.IsNotFound(err) {
				t.Errorf("want the server's NotFound, got %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := conns.Load(); n != 1 {
		t.Errorf("three requests started together opened %d connections, want 1", n)
	}
}

func TestRequestsDoNotWaitForAFirstRequestThatGotNoConnection(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens there now
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if _, err := c.Leases("ns").Get(ctx, "x", metav1.GetOptions{}); err == nil || ctx.Err() != nil {
				t.Errorf("want a connection error before the deadline, got %v (deadline: %v)", err, ctx.Err())
			}
		})
	}
	wg.Wait()
}
