package install

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// jwt is a token with the given claims and a signature nobody checks here.
func jwt(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(claims)) + "." + enc([]byte("signature"))
}

// podToken has the claims the API server puts in a token bound to a pod on
// node; seq tells tokens apart.
func podToken(node string, seq int) string {
	return jwt(fmt.Sprintf(`{"iss":"https://kubernetes.default.svc","jti":"%d","kubernetes.io":{"namespace":"galactic-system",`+
		`"node":{"name":%q,"uid":"n1"},"pod":{"name":"galactic-node-x","uid":"p1"},"serviceaccount":{"name":"galactic-node","uid":"s1"}}}`, seq, node))
}

func TestInstallRefusesATokenNotBoundToThisNode(t *testing.T) {
	for _, tc := range []struct {
		name, token string
		want        []string
	}{
		{"legacy Secret token", jwt(`{"iss":"kubernetes/serviceaccount","kubernetes.io/serviceaccount/secret.name":"galactic-node-token"}`),
			[]string{"long-lived Secret token", "projected serviceAccountToken"}},
		{"bound to no pod", jwt(`{"kubernetes.io":{"namespace":"galactic-system","serviceaccount":{"name":"galactic-node","uid":"s1"}}}`),
			[]string{"bound to no pod", "--token-file"}},
		{"pod without node", jwt(`{"kubernetes.io":{"namespace":"galactic-system","pod":{"name":"galactic-node-x","uid":"p1"}}}`),
			[]string{"bound to pod galactic-node-x but names no node", "ServiceAccountTokenPodNodeInfo"}},
		{"another node", podToken("node-b", 1), []string{"bound to node node-b, not to this node node-a"}},
		{"not a JWT", "opaque-token", []string{"not a JSON web token"}},
		{"unreadable claims", "a.%%%.c", []string{"not a JSON web token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			must(t, os.WriteFile(f.token, []byte(tc.token), 0o600))
			err := Install(f.options())
			if err == nil {
				t.Fatal("install succeeded")
			}
			for _, w := range append(tc.want, f.token) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if entries, _ := os.ReadDir(f.root); len(entries) != 0 {
				t.Errorf("a refused install wrote %d entries under the root", len(entries))
			}
		})
	}
}

func TestATokenWithoutAKnownNodeNeedsOnlyANodeClaim(t *testing.T) {
	if err := checkNodeBound([]byte(podToken("node-b", 1)), ""); err != nil {
		t.Errorf("a node-bound token with no node name to match: %v", err)
	}
	if err := checkNodeBound([]byte(podToken("node-a", 1)), "node-a"); err != nil {
		t.Errorf("node-a's token on node-a: %v", err)
	}
}

// nodeBoundToken has the claims of a token bound to the Node object.
func nodeBoundToken(node string, iat, exp int64) string {
	return jwt(fmt.Sprintf(`{"iat":%d,"exp":%d,"kubernetes.io":{"namespace":"galactic-system",`+
		`"node":{"name":%q,"uid":"n1"},"serviceaccount":{"name":"galactic-node","uid":"s1"}}}`, iat, exp, node))
}

// fakeRequester issues node-bound tokens valid for the requested seconds
// from the fixture's clock, and counts the requests.
type fakeRequester struct {
	now  *time.Time
	reqs []NodeTokenRequest
	err  error
	// token, when set, is returned instead.
	token string
}

func (r *fakeRequester) request(_ context.Context, req NodeTokenRequest) ([]byte, error) {
	r.reqs = append(r.reqs, req)
	if r.err != nil {
		return nil, r.err
	}
	if r.token != "" {
		return []byte(r.token), nil
	}
	return []byte(nodeBoundToken(req.Node, r.now.Unix(), r.now.Unix()+req.Seconds)), nil
}

func nodeTokenOptions(f *fixture, r *fakeRequester) Options {
	o := f.options()
	o.NodeTokenSeconds = 3600
	o.RequestToken = r.request
	o.Now = func() time.Time { return *r.now }
	return o
}

func TestTheKubeconfigCarriesATokenBoundToTheNodeRequestedWithThePodsToken(t *testing.T) {
	f := newFixture(t)
	now := time.Unix(1_800_000_000, 0)
	r := &fakeRequester{now: &now}
	must(t, Install(nodeTokenOptions(f, r)))
	if len(r.reqs) != 1 {
		t.Fatalf("%d token requests, want 1", len(r.reqs))
	}
	req := r.reqs[0]
	if req.Node != "node-a" || req.ServiceAccount != "galactic-node" || req.Namespace != "galactic-system" || string(req.PodToken) != token1 || req.Seconds != 3600 {
		t.Fatalf("token request %+v", req)
	}
	want := nodeBoundToken("node-a", now.Unix(), now.Unix()+3600)
	cfg, err := clientcmd.BuildConfigFromFlags("", f.path("/etc/galactic/kubeconfig"))
	must(t, err)
	if cfg.BearerToken != want {
		t.Fatalf("kubeconfig token %q, want the node-bound one", cfg.BearerToken)
	}

	// Within the first half of its life the token is kept: nothing changes.
	now = now.Add(29 * time.Minute)
	f.out.Reset()
	must(t, Install(nodeTokenOptions(f, r)))
	if len(r.reqs) != 1 || !strings.Contains(f.out.String(), "nothing changed") {
		t.Fatalf("a second install within half the lifetime: %d requests\n%s", len(r.reqs), f.out.String())
	}
}

func TestRunRenewsTheNodeTokenAtHalfItsLifetime(t *testing.T) {
	f := newFixture(t)
	start := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	now := start
	r := &fakeRequester{now: &now}
	o := nodeTokenOptions(f, r)
	must(t, Install(o))
	o.Out = io.Discard
	o.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	o.RequestToken = func(ctx context.Context, req NodeTokenRequest) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		return r.request(ctx, req)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, 5*time.Millisecond, time.Minute) }()

	mu.Lock()
	now = start.Add(31 * time.Minute)
	mu.Unlock()
	want := nodeBoundToken("node-a", start.Add(31*time.Minute).Unix(), start.Add(91*time.Minute).Unix())
	waitFor(t, "the kubeconfig to carry the renewed token", func() bool {
		cfg, err := clientcmd.BuildConfigFromFlags("", f.path("/etc/galactic/kubeconfig"))
		return err == nil && cfg.BearerToken == want
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(r.reqs) != 2 {
		t.Fatalf("%d token requests, want the install's and one renewal", len(r.reqs))
	}
}

func TestANodeTokenThatCannotBeHadFailsInstallAndWritesNothing(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for name, r := range map[string]*fakeRequester{
		"refused":         {now: &now, err: fmt.Errorf("serviceaccounts \"galactic-node\" is forbidden")},
		"bound to a pod":  {now: &now, token: podToken("node-a", 3)},
		"another node":    {now: &now, token: nodeBoundToken("node-b", now.Unix(), now.Unix()+3600)},
		"not a JWT token": {now: &now, token: "opaque"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			err := Install(nodeTokenOptions(f, r))
			if err == nil || !strings.Contains(err.Error(), "Node node-a") {
				t.Fatalf("Install = %v, want an error naming Node node-a", err)
			}
			if entries, _ := os.ReadDir(f.root); len(entries) != 0 {
				t.Fatalf("a failed install wrote %v", entries)
			}
		})
	}
	f := newFixture(t)
	o := f.options()
	o.NodeTokenSeconds = 60
	if err := Install(o); err == nil || !strings.Contains(err.Error(), "--node-token-seconds") {
		t.Fatalf("a 60 s token: %v, want an error naming --node-token-seconds", err)
	}
}
