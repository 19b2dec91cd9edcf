package harness

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
)

// egressProxy is how the cluster's API server reaches its nodes: the
// kubelets run in the nodes' network namespaces, which the API server's
// namespace has no route to. The API server's egress selector sends its
// "cluster" traffic (kubectl logs, exec, port-forward, node and pod
// proxies) through HTTP CONNECT on a unix socket, as it would through a
// konnectivity server; the proxy dials each node's address from inside
// that node's namespace.
type egressProxy struct {
	socket string
	l      net.Listener

	mu    sync.Mutex
	nodes map[netip.Addr]string
	conns map[net.Conn]struct{}
}

// egressConfig is the API server's --egress-selector-config-file for a
// proxy on socket.
func egressConfig(socket string) string {
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: ` + socket + `
`
}

// startEgressProxy listens in dir and writes the API server's egress
// configuration there; it returns the proxy and the configuration's path.
func startEgressProxy(dir string) (*egressProxy, string, error) {
	p := &egressProxy{socket: filepath.Join(dir, "egress.sock"), nodes: map[netip.Addr]string{}, conns: map[net.Conn]struct{}{}}
	cfg := filepath.Join(dir, "egress-selector.yaml")
	if err := os.WriteFile(cfg, []byte(egressConfig(p.socket)), 0o644); err != nil {
		return nil, "", err
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, "", fmt.Errorf("the API server's egress socket: %w", err)
	}
	p.l = l
	go p.serve()
	return p, cfg, nil
}

// route makes addr reachable: connections to it are dialled inside the
// network namespace at netnsPath.
func (p *egressProxy) route(addr netip.Addr, netnsPath string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodes[addr] = netnsPath
}

// unroute forgets addr.
func (p *egressProxy) unroute(addr netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.nodes, addr)
}

func (p *egressProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

// handle answers one CONNECT and then relays both ways.
func (p *egressProxy) handle(c net.Conn) {
	if !p.track(c, true) {
		c.Close()
		return
	}
	defer p.track(c, false)
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	fail := func(code int, format string, a ...any) {
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n\r\n%s\n", code, http.StatusText(code), fmt.Sprintf(format, a...))
	}
	if req.Method != http.MethodConnect {
		fail(http.StatusMethodNotAllowed, "only CONNECT")
		return
	}
	ap, err := netip.ParseAddrPort(req.Host)
	if err != nil {
		fail(http.StatusBadRequest, "%s is not an address and port: %v", req.Host, err)
		return
	}
	p.mu.Lock()
	netnsPath, ok := p.nodes[ap.Addr().Unmap()]
	p.mu.Unlock()
	if !ok {
		fail(http.StatusBadGateway, "%s is no node's address", ap.Addr())
		return
	}
	var up net.Conn
	err = ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		var err error
		up, err = net.Dial("tcp", ap.String())
		return err
	})
	if err != nil {
		fail(http.StatusBadGateway, "dialling %s in its node: %v", ap, err)
		return
	}
	defer up.Close()
	if !p.track(up, true) {
		return
	}
	defer p.track(up, false)
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// What the API server sent after the request is already in br.
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, br); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// track adds or removes a connection; it refuses new ones once closed.
func (p *egressProxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// close stops listening and ends every relayed connection.
func (p *egressProxy) close() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	_ = os.Remove(p.socket)
}
