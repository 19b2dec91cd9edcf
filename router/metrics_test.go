package router

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

func TestHealthzIsLivenessAndReadyzAlsoWantsAnEstablishedSession(t *testing.T) {
	clk := testingclock.NewFakeClock(epoch)
	m := NewMetrics(clk)
	h := m.Handler(time.Minute)
	code := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	check := func(when string, healthz, readyz int) {
		t.Helper()
		if got := code("/healthz"); got != healthz {
			t.Errorf("%s: /healthz %d, want %d", when, got, healthz)
		}
		if got := code("/readyz"); got != readyz {
			t.Errorf("%s: /readyz %d, want %d", when, got, readyz)
		}
	}
	check("before the first pass", 503, 503)
	m.observePass(time.Millisecond)
	m.set(0, 0, map[string]bool{"192.0.2.1": false})
	check("passes run, no session", 200, 503)
	m.set(0, 0, map[string]bool{"192.0.2.1": false, "192.0.2.2": true})
	check("passes run, one session up", 200, 200)
	clk.Step(2 * time.Minute)
	check("no pass for longer than the limit", 503, 503)
}
