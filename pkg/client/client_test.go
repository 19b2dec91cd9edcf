package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
