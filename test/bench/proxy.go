package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/galactic-cni/galactic/test/harness"
)

// Request is one API request the proxy relayed.
type Request struct {
	// Accepted is when the request's connection was accepted (before the
	// TLS handshake); At is when its headers had arrived.
	Accepted, At time.Time
	// Done is when the API server's response headers were relayed.
	Done   time.Time
	Method string
	// Path is the URL path; Query its raw query.
	Path, Query string
	// Agent is the client's program: the user agent up to the first "/".
	Agent  string
	Status int
}

// Verb is the Kubernetes verb of the request.
func (r Request) Verb() string {
	switch r.Method {
	case http.MethodGet:
		if strings.Contains(r.Query, "watch=true") || strings.Contains(r.Query, "watch=1") {
			return "watch"
		}
		if r.name() == "" {
			return "list"
		}
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		if r.name() == "" {
			return "deletecollection"
		}
		return "delete"
	}
	return strings.ToLower(r.Method)
}

// Resource is the plural resource name (with subresource) of the request.
func (r Request) Resource() string {
	res, _, sub := r.parts()
	if sub != "" {
		return res + "/" + sub
	}
	return res
}

func (r Request) name() string {
	_, name, _ := r.parts()
	return name
}

// parts splits /api(s)/.../[namespaces/<ns>/]<resource>[/<name>[/<sub>]].
func (r Request) parts() (resource, name, sub string) {
	seg := strings.Split(strings.Trim(r.Path, "/"), "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return r.Path, "", ""
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	if len(seg) > 0 {
		resource = seg[0]
	}
	if len(seg) > 1 {
		name = seg[1]
	}
	if len(seg) > 2 {
		sub = seg[2]
	}
	return
}

// Proxy is a TLS-terminating reverse proxy in front of the API server that
// records every request it relays. A node's kubeconfig points at it to
// count what the node's programs ask of the API server; upstream it speaks
// as the control plane's admin.
type Proxy struct {
	// Port is the proxy's port on 127.0.0.1 (forwarded into nodes).
	Port int
	// Kubeconfig reaches the API server through the proxy.
	Kubeconfig string

	srv  *http.Server
	mu   sync.Mutex
	reqs []Request
	// begun are the requests as they arrived: a watch shows here while it
	// is open, in reqs only once it ends.
	begun []Request
}

type acceptedKey struct{}

// StartProxy starts a proxy in front of cp with its own CA under dir.
func StartProxy(cp *harness.ControlPlane, dir string) (*Proxy, error) {
	upstream, err := url.Parse(cp.Server)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(cp.Admin)
	if err != nil {
		return nil, err
	}
	caFile, cert, err := proxyCerts(dir)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Port: ln.Addr().(*net.TCPAddr).Port, Kubeconfig: filepath.Join(dir, "proxy.kubeconfig")}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(upstream) },
		Transport:     rt,
		FlushInterval: -1,
	}
	p.srv = &http.Server{
		Handler:   p.record(rp),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert},
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, acceptedKey{}, time.Now())
		},
		ReadHeaderTimeout: 30 * time.Second,
	}
	go func() { _ = p.srv.ServeTLS(ln, "", "") }()

	// The client presents the admin certificate as it would to the API
	// server, so the handshake costs what the real one does.
	auth := &clientcmdapi.AuthInfo{ClientCertificate: cp.Admin.CertFile, ClientKey: cp.Admin.KeyFile}
	if err := harness.WriteKubeconfig(p.Kubeconfig, fmt.Sprintf("https://127.0.0.1:%d", p.Port), caFile, auth); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close stops the proxy.
func (p *Proxy) Close() { _ = p.srv.Close() }

type statusWriter struct {
	http.ResponseWriter
	status int
	done   time.Time
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status, w.done = code, time.Now()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status, w.done = http.StatusOK, time.Now()
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (p *Proxy) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := Request{At: time.Now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery}
		req.Accepted, _ = r.Context().Value(acceptedKey{}).(time.Time)
		req.Agent, _, _ = strings.Cut(r.UserAgent(), "/")
		p.mu.Lock()
		p.begun = append(p.begun, req)
		p.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		req.Status, req.Done = sw.status, sw.done
		p.mu.Lock()
		p.reqs = append(p.reqs, req)
		p.mu.Unlock()
	})
}

// Mark is the position to count from.
func (p *Proxy) Mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

// Since returns the requests relayed since mark, optionally only those of
// one agent.
func (p *Proxy) Since(mark int, agent string) []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Request
	for _, r := range p.reqs[mark:] {
		if agent == "" || r.Agent == agent {
			out = append(out, r)
		}
	}
	return out
}

// Begun returns the requests of agent that arrived in [from, to), ended
// or not, without their status.
func (p *Proxy) Begun(agent string, from, to time.Time) []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Request
	for _, r := range p.begun {
		if r.Agent == agent && !r.At.Before(from) && r.At.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// Unattributed counts the relayed requests whose user agent names neither
// a galactic program nor the bench itself (its in-process GC passes), by
// agent: requests the per-program counts miss.
func (p *Proxy) Unattributed() map[string]int {
	self, _, _ := strings.Cut(rest.DefaultKubernetesUserAgent(), "/")
	p.mu.Lock()
	defer p.mu.Unlock()
	var out map[string]int
	for _, r := range p.reqs {
		if !strings.HasPrefix(r.Agent, "galactic-") && r.Agent != self {
			if out == nil {
				out = map[string]int{}
			}
			out[r.Agent]++
		}
	}
	return out
}

// proxyCerts makes a CA (written to dir/proxy-ca.crt) and a serving
// certificate for 127.0.0.1 signed by it.
func proxyCerts(dir string) (caFile string, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", cert, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "galactic-bench-proxy-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", cert, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", cert, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "galactic-bench-proxy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", cert, err
	}
	caFile = filepath.Join(dir, "proxy-ca.crt")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return "", cert, err
	}
	return caFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
