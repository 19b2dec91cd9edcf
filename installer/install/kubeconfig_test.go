package install

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
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
