package install

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultNodeTokenSeconds is the node credential's lifetime. It is renewed
// at half of it, so a node keeps a valid credential for at least half an
// hour with no galactic pod running (a rollout, a crash loop).
const DefaultNodeTokenSeconds = 3600

// minTokenSeconds is the shortest lifetime the TokenRequest API grants.
const minTokenSeconds = 600

// NodeTokenRequest is one TokenRequest: a token of the service account
// bound to the Node, asked for with the pod's own token.
type NodeTokenRequest struct {
	Server         string
	CA             []byte
	PodToken       []byte
	Namespace      string
	ServiceAccount string
	Node           string
	Seconds        int64
}

// TokenRequester performs a NodeTokenRequest; RequestNodeToken is the real
// one.
type TokenRequester func(context.Context, NodeTokenRequest) ([]byte, error)

// RequestNodeToken asks the API server for a token bound to the Node
// object (ServiceAccountTokenNodeBinding, GA in Kubernetes 1.33): it stays
// valid while the Node exists, whatever happens to the pod that asked.
func RequestNodeToken(ctx context.Context, r NodeTokenRequest) ([]byte, error) {
	kube, err := kubernetes.NewForConfig(&rest.Config{
		Host: r.Server, BearerToken: string(r.PodToken),
		TLSClientConfig: rest.TLSClientConfig{CAData: r.CA}, Timeout: 20 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	seconds := r.Seconds
	tr, err := kube.CoreV1().ServiceAccounts(r.Namespace).CreateToken(ctx, r.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &seconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: r.Node},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return []byte(tr.Status.Token), nil
}

// tokenClaims are the claims of a service account token install reads,
// without verifying them (the API server does).
type tokenClaims struct {
	IssuedAt  int64 `json:"iat"`
	Expiry    int64 `json:"exp"`
	NotBefore int64 `json:"nbf"`
	// Kubernetes is nil in a long-lived Secret token.
	Kubernetes *struct {
		Namespace      string `json:"namespace"`
		ServiceAccount struct {
			Name string `json:"name"`
		} `json:"serviceaccount"`
		Pod *struct {
			Name string `json:"name"`
		} `json:"pod"`
		Node *struct {
			Name string `json:"name"`
		} `json:"node"`
	} `json:"kubernetes.io"`
}

func parseClaims(token []byte) (tokenClaims, error) {
	var c tokenClaims
	parts := bytes.Split(token, []byte("."))
	if len(parts) != 3 {
		return c, fmt.Errorf("is not a JSON web token")
	}
	payload, err := base64.RawURLEncoding.DecodeString(string(parts[1]))
	if err != nil {
		return c, fmt.Errorf("is not a JSON web token (%v)", err)
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return c, fmt.Errorf("has unreadable claims (%v)", err)
	}
	return c, nil
}

// boundToNode is whether the claims are of a token bound to the Node
// object node itself (not to a pod on it).
func (c tokenClaims) boundToNode(node string) bool {
	k := c.Kubernetes
	return k != nil && k.Pod == nil && k.Node != nil && k.Node.Name == node
}

// fresh is whether less than half of the token's lifetime has passed.
func (c tokenClaims) fresh(now time.Time) bool {
	if c.IssuedAt == 0 || c.Expiry <= c.IssuedAt {
		return false
	}
	return now.Unix() < c.IssuedAt+(c.Expiry-c.IssuedAt)/2
}

// nodeToken is the token the node kubeconfig carries: the current copy
// while it is bound to this Node and fresh, else a new one requested with
// the pod's token. A fresh copy is kept, so install and run change
// nothing until renewal is due.
func (o Options) nodeToken(p paths, server string, ca, podToken []byte) ([]byte, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	if cur, err := os.ReadFile(p.token); err == nil {
		cur = bytes.TrimSpace(cur)
		if c, err := parseClaims(cur); err == nil && c.boundToNode(o.NodeName) && c.fresh(now()) {
			return cur, nil
		}
	}
	pc, err := parseClaims(podToken)
	if err != nil || pc.Kubernetes == nil {
		return nil, fmt.Errorf("the service account token %s names no service account", o.TokenFile)
	}
	req := o.RequestToken
	if req == nil {
		req = RequestNodeToken
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token, err := req(ctx, NodeTokenRequest{
		Server: server, CA: ca, PodToken: podToken,
		Namespace: pc.Kubernetes.Namespace, ServiceAccount: pc.Kubernetes.ServiceAccount.Name,
		Node: o.NodeName, Seconds: o.NodeTokenSeconds,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot get a token bound to Node %s (TokenRequest for %s/%s): %w: the Role must grant create on serviceaccounts/token (installer/manifests/rbac.yaml), the API server must be 1.33 or later, or pass --node-token-seconds=0 to use the pod's token", o.NodeName, pc.Kubernetes.Namespace, pc.Kubernetes.ServiceAccount.Name, err)
	}
	token = bytes.TrimSpace(token)
	c, err := parseClaims(token)
	if err != nil || !c.boundToNode(o.NodeName) {
		return nil, fmt.Errorf("the API server returned a token not bound to Node %s for a node-bound TokenRequest", o.NodeName)
	}
	return token, nil
}
