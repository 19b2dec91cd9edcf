package install

import (
	"bytes"
	"fmt"
	"net"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// credentials are the node kubeconfig and, when it was built from the
// service account, the token it names as its tokenFile.
type credentials struct {
	kubeconfig []byte
	token      []byte // nil when the kubeconfig came from SourceKubeconfig
}

// buildCredentials reads the credential inputs: the given kubeconfig, or
// the pod's service account token, CA and the in-cluster API server.
func (o Options) buildCredentials(p paths) (credentials, error) {
	if o.SourceKubeconfig != "" {
		data, err := flattenKubeconfig(o.SourceKubeconfig)
		return credentials{kubeconfig: data}, err
	}
	token, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return credentials{}, fmt.Errorf("cannot read the service account token %s: %w: run in a pod whose service account token is mounted there, pass --token-file, or pass --kubeconfig", o.TokenFile, err)
	}
	token = bytes.TrimSpace(token)
	if len(token) == 0 {
		return credentials{}, fmt.Errorf("the service account token %s is empty: check the pod's projected token volume", o.TokenFile)
	}
	if err := checkNodeBound(token, o.NodeName); err != nil {
		return credentials{}, fmt.Errorf("the service account token %s %w", o.TokenFile, err)
	}
	ca, err := os.ReadFile(o.CAFile)
	if err != nil {
		return credentials{}, fmt.Errorf("cannot read the cluster CA %s: %w: mount the kube-root-ca.crt ConfigMap there or pass --ca-file", o.CAFile, err)
	}
	server := o.APIServer
	if server == "" {
		host, port := o.getenv(EnvServiceHost), o.getenv(EnvServicePort)
		if host == "" || port == "" {
			return credentials{}, fmt.Errorf("cannot tell the API server's address: %s and %s are not set (the kubelet sets them in every pod); pass --api-server", EnvServiceHost, EnvServicePort)
		}
		server = "https://" + net.JoinHostPort(host, port)
	}
	if o.NodeTokenSeconds > 0 {
		if token, err = o.nodeToken(p, server, ca, token); err != nil {
			return credentials{}, err
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["galactic"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	// The embedded token makes the file stand alone; tokenFile lets a
	// long-running client (client-go re-reads it) follow rotation without
	// reloading the kubeconfig.
	cfg.AuthInfos["galactic"] = &clientcmdapi.AuthInfo{Token: string(token), TokenFile: p.token}
	cfg.Contexts["galactic"] = &clientcmdapi.Context{Cluster: "galactic", AuthInfo: "galactic", Namespace: o.Namespace}
	cfg.CurrentContext = "galactic"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return credentials{}, fmt.Errorf("encoding the kubeconfig: %w", err)
	}
	return credentials{kubeconfig: data, token: token}, nil
}

// flattenKubeconfig reduces a kubeconfig to its current context and embeds
// the files it refers to, so the copy works wherever it is put.
func flattenKubeconfig(path string) ([]byte, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read --kubeconfig %s: %w", path, err)
	}
	if err := clientcmdapi.MinifyConfig(cfg); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w: set its current-context", path, err)
	}
	if err := clientcmdapi.FlattenConfig(cfg); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: cannot embed the files it refers to: %w", path, err)
	}
	if err := clientcmd.Validate(*cfg); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s is not usable: %w", path, err)
	}
	return clientcmd.Write(*cfg)
}

// nodeBoundFix is what makes a token node-bound, for the errors below.
const nodeBoundFix = "mount the pod's projected serviceAccountToken volume at --token-file (installer/manifests/daemonset.yaml does), or pass a token requested for a pod on this node"

// checkNodeBound reads the token's claims, without verifying them (the API
// server does), to refuse what the admission policy would refuse on every
// write: a long-lived Secret token, a token bound to no pod, or one bound to
// a pod on another node. node is this node's name; empty skips the match.
// The error completes a sentence that starts with the token's path.
func checkNodeBound(token []byte, node string) error {
	claims, err := parseClaims(token)
	if err != nil {
		return fmt.Errorf("%w: %s", err, nodeBoundFix)
	}
	k := claims.Kubernetes
	switch {
	case k == nil:
		return fmt.Errorf("has no kubernetes.io claim, so it is a long-lived Secret token or not a service account token; the admission policy refuses its writes: %s", nodeBoundFix)
	case k.Pod == nil:
		return fmt.Errorf("is bound to no pod; the admission policy refuses its writes: %s", nodeBoundFix)
	case k.Node == nil || k.Node.Name == "":
		return fmt.Errorf("is bound to pod %s but names no node, which the API server adds from Kubernetes 1.30 (feature gate ServiceAccountTokenPodNodeInfo); the admission policy refuses its writes: upgrade the API server or enable the gate", k.Pod.Name)
	case node != "" && k.Node.Name != node:
		return fmt.Errorf("is bound to node %s, not to this node %s (--node-name): %s", k.Node.Name, node, nodeBoundFix)
	}
	return nil
}
