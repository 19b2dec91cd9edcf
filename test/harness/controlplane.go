package harness

import (
	"bytes"
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ControlPlane is a real etcd and kube-apiserver on loopback, with an admin
// identity, for one test binary or one demo.
type ControlPlane struct {
	// Dir holds certificates, data and logs; removed by Stop.
	Dir string
	// Port is the API server's port on 127.0.0.1 (and on a node netns's
	// loopback, through the node's forwarder).
	Port int
	// Server is the API server URL.
	Server string
	// CAFile verifies the API server.
	CAFile string
	// Admin is a system:masters identity.
	Admin *rest.Config
	// AdminKubeconfig is Admin as a kubeconfig file.
	AdminKubeconfig string

	pki   *pki
	procs []*Process
	// saKey signs service account tokens; the controller manager needs it.
	saKey string
	names []string
	// egress relays the API server's connections to the nodes' kubelets
	// (a cluster's only).
	egress *egressProxy
}

// controlPlaneOptions are what a cluster changes in the control plane.
type controlPlaneOptions struct {
	// authorization is the API server's --authorization-mode.
	authorization string
	// admission plugins enabled beside the defaults.
	admission string
	// allowPrivileged admits privileged containers (kubectl debug node's
	// sysadmin profile), as kubeadm's clusters do.
	allowPrivileged bool
	// kubelets lets the API server reach kubelets in node namespaces
	// (logs, exec, port-forward) through an egress proxy, with a client
	// certificate the kubelets authenticate, as kubeadm sets it up.
	kubelets bool
}

// StartControlPlane builds (first time only) and starts etcd and
// kube-apiserver, waits until the API server is ready and installs the CRDs
// of installer/manifests/crds. log receives build progress and, on failure,
// the servers' output; it may be nil.
func StartControlPlane(ctx context.Context, log io.Writer) (cp *ControlPlane, err error) {
	return startControlPlane(ctx, log, controlPlaneOptions{authorization: "RBAC"})
}

func startControlPlane(ctx context.Context, log io.Writer, o controlPlaneOptions) (cp *ControlPlane, err error) {
	bins, err := EnsureControlPlaneBinaries(log)
	if err != nil {
		return nil, err
	}
	dir, err := MkdirTemp("galactic-controlplane-")
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{Dir: dir}
	defer func() {
		if err != nil {
			cp.dumpLogs(log)
			cp.Stop()
			cp = nil
		}
	}()
	ports, err := freePorts(3)
	if err != nil {
		return cp, err
	}
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.Port = ports[2]
	cp.Server = "https://127.0.0.1:" + strconv.Itoa(cp.Port)

	if cp.pki, err = newPKI(dir); err != nil {
		return cp, err
	}
	cp.CAFile = cp.pki.path("ca.crt")
	servingCert, servingKey, err := cp.pki.issue("serving", pkix.Name{CommonName: "kube-apiserver"}, true)
	if err != nil {
		return cp, err
	}
	adminCert, adminKey, err := cp.pki.issue("admin", pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}}, false)
	if err != nil {
		return cp, err
	}
	_, saKey, err := cp.pki.issue("service-accounts", pkix.Name{CommonName: "service-accounts"}, false)
	if err != nil {
		return cp, err
	}
	cp.saKey = saKey
	var admission []string
	if o.admission != "" {
		admission = []string{"--enable-admission-plugins=" + o.admission}
	}
	if o.allowPrivileged {
		admission = append(admission, "--allow-privileged=true")
	}
	if o.kubelets {
		var cfg string
		if cp.egress, cfg, err = startEgressProxy(dir); err != nil {
			return cp, err
		}
		cert, key, err := cp.pki.issue("apiserver-kubelet-client", pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, false)
		if err != nil {
			return cp, err
		}
		// A kubelet reports its node name as its Hostname address too;
		// the egress proxy knows nodes by address.
		admission = append(admission, "--egress-selector-config-file="+cfg,
			"--kubelet-client-certificate="+cert, "--kubelet-client-key="+key,
			"--kubelet-preferred-address-types=InternalIP,Hostname")
	}

	if err = cp.start("etcd", bins.Etcd,
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdClient, "--advertise-client-urls="+etcdClient,
		"--listen-peer-urls="+etcdPeer, "--initial-advertise-peer-urls="+etcdPeer,
		"--initial-cluster=default="+etcdPeer,
		"--unsafe-no-fsync", "--log-level=warn",
	); err != nil {
		return cp, err
	}
	if err = cp.start("kube-apiserver", bins.APIServer, append(admission,
		"--etcd-servers="+etcdClient,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(cp.Port),
		"--tls-cert-file="+servingCert, "--tls-private-key-file="+servingKey,
		"--client-ca-file="+cp.CAFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saKey, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--authorization-mode="+o.authorization,
		"--endpoint-reconciler-type=none",
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"),
		"--v=0",
	)...); err != nil {
		return cp, err
	}

	cp.Admin = &rest.Config{
		Host:            cp.Server,
		TLSClientConfig: rest.TLSClientConfig{CAFile: cp.CAFile, CertFile: adminCert, KeyFile: adminKey},
		QPS:             -1,
	}
	cp.AdminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err = WriteKubeconfig(cp.AdminKubeconfig, cp.Server, cp.CAFile, &clientcmdapi.AuthInfo{ClientCertificate: adminCert, ClientKey: adminKey}); err != nil {
		return cp, err
	}
	if err = cp.waitReady(ctx); err != nil {
		return cp, err
	}
	if err = ApplyManifests(ctx, cp.Admin, filepath.Join(RepoRoot(), "installer", "manifests", "crds")); err != nil {
		return cp, fmt.Errorf("installing CRDs: %w", err)
	}
	return cp, nil
}

func (cp *ControlPlane) start(name, bin string, args ...string) error {
	p, err := StartProcess(name, exec.Command(bin, args...), filepath.Join(cp.Dir, name+".log"))
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, p)
	cp.names = append(cp.names, name)
	return nil
}

func (cp *ControlPlane) waitReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var lastErr error
	for {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return nil
		}
		lastErr = err
		for _, p := range cp.procs {
			if !p.Running() {
				return fmt.Errorf("%s exited", p.Name)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready: %v", lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop ends both servers and removes their data. Safe to call twice.
func (cp *ControlPlane) Stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		cp.procs[i].Stop(syscall.SIGTERM, 10*time.Second)
	}
	cp.procs = nil
	if cp.egress != nil {
		cp.egress.close()
		cp.egress = nil
	}
	switch {
	case cp.Dir == "":
	case os.Getenv("GALACTIC_KEEP_CONTROLPLANE") != "":
		untrack("dir " + cp.Dir)
	default:
		_ = RemoveDir(cp.Dir)
	}
}

func (cp *ControlPlane) dumpLogs(w io.Writer) {
	if w == nil {
		return
	}
	for _, name := range cp.names {
		b, err := os.ReadFile(filepath.Join(cp.Dir, name+".log"))
		if err != nil {
			continue
		}
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		fmt.Fprintf(w, "--- %s log (tail) ---\n%s\n", name, b)
	}
}

// WriteKubeconfig writes a single-context kubeconfig (mode 0600), embedding
// the CA and any client certificate files so the file stands alone.
func WriteKubeconfig(path, server, caFile string, auth *clientcmdapi.AuthInfo) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	auth = auth.DeepCopy()
	if auth.ClientCertificate != "" {
		if auth.ClientCertificateData, err = os.ReadFile(auth.ClientCertificate); err != nil {
			return err
		}
		if auth.ClientKeyData, err = os.ReadFile(auth.ClientKey); err != nil {
			return err
		}
		auth.ClientCertificate, auth.ClientKey = "", ""
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["galactic"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["galactic"] = auth
	cfg.Contexts["galactic"] = &clientcmdapi.Context{Cluster: "galactic", AuthInfo: "galactic"}
	cfg.CurrentContext = "galactic"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	if len(ports) != n {
		return nil, errors.New("no free ports")
	}
	return ports, nil
}
