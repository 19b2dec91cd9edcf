package install

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/router/config"
)

// Defaults for the paths that pkg/settings does not already define.
const (
	DefaultCNIBinDir         = "/opt/cni/bin"
	DefaultCNIConfDir        = "/etc/cni/net.d"
	DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// ManifestName is the install record kept in the state dir.
	ManifestName = "installed.json"
	// TokenName is the copy of the service account token kept next to the
	// node kubeconfig, which the kubeconfig names as its tokenFile.
	TokenName = "token"
)

// Environment variables install reads when the matching option is empty.
// NODE_NAME is what the DaemonSet sets from spec.nodeName; the
// KUBERNETES_SERVICE_* pair is set in every pod by the kubelet.
const (
	EnvNodeName    = "NODE_NAME"
	EnvServiceHost = "KUBERNETES_SERVICE_HOST"
	EnvServicePort = "KUBERNETES_SERVICE_PORT"
)

// Binaries are the plugins install copies into the CNI bin dir.
func Binaries() []string { return []string{"galactic-cni", "galactic-bgp"} }

// Options are the inputs of Install, Uninstall and Run. The zero value of a
// path means its default.
type Options struct {
	// Root prefixes every host path (CNIBinDir, NodeConfig, RouterConfig,
	// Kubeconfig, StateDir, LogFile); empty in a DaemonSet.
	Root string
	// SourceDir holds the plugin binaries to copy.
	SourceDir string
	// CNIBinDir receives the plugin binaries.
	CNIBinDir string
	// ConflistSource is the network config list to install (a mounted
	// ConfigMap file); empty installs none. It is written into CNIConfDir
	// as ConflistName (default: the source's base name), last of all
	// files, so the runtime finds the plugins and their settings in place
	// the moment it sees the network.
	ConflistSource string
	CNIConfDir     string
	ConflistName   string
	// NodeConfig is the node settings file to write.
	NodeConfig string
	// Kubeconfig is the kubeconfig to write for the plugins.
	Kubeconfig string
	// StateDir and LogFile are written into the node settings; the state
	// dir and the log file's directory are created.
	StateDir string
	LogFile  string
	// RequireAttachmentObjects is written into the node settings: the
	// plugins then refuse inline attachments, so every attachment on the
	// node is a VPCAttachment the control plane granted.
	RequireAttachmentObjects bool
	// Namespace holds the galactic objects.
	Namespace string
	// NodeName is this node's Kubernetes name; from NODE_NAME or
	// GALACTIC_NODE_NAME when empty.
	NodeName string
	// SourceKubeconfig, when set, is flattened into Kubeconfig instead of
	// building one from the service account.
	SourceKubeconfig string
	// TokenFile and CAFile are the pod's service account token and cluster
	// CA; APIServer defaults to the in-cluster service address.
	TokenFile string
	CAFile    string
	APIServer string
	// NodeTokenSeconds, when positive, makes the kubeconfig carry a token
	// bound to the Node object, of this lifetime, requested with the pod's
	// token and renewed at half of it: unlike the pod's token it survives
	// the pod. Zero writes the pod's token itself.
	NodeTokenSeconds int64
	// RequestToken performs the TokenRequest; nil is RequestNodeToken.
	RequestToken TokenRequester
	// Now is the clock that judges the token's age; nil is time.Now.
	Now func() time.Time
	// RouterConfig is galactic-router's config file to write; RouterSource
	// (a mounted ConfigMap file) and Router (flags) are what goes in it.
	// With neither, no router config is written.
	RouterConfig string
	RouterSource string
	Router       RouterSettings
	// RouterBinary runs the drain on uninstall; empty looks on PATH.
	RouterBinary string
	// DryRun prints what would change and writes nothing.
	DryRun bool

	Getenv func(string) string
	Out    io.Writer
}

// paths are the resolved host paths, root included.
type paths struct {
	cniBin, cniConf, nodeConfig, kubeconfig, token, stateDir, logFile, manifest, routerConfig string
}

func (o Options) getenv(k string) string {
	if o.Getenv == nil {
		return ""
	}
	return o.Getenv(k)
}

func (o Options) out() io.Writer {
	if o.Out == nil {
		return io.Discard
	}
	return o.Out
}

// withDefaults fills every empty option with its default.
func (o Options) withDefaults() Options {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&o.CNIBinDir, DefaultCNIBinDir)
	def(&o.CNIConfDir, DefaultCNIConfDir)
	if o.ConflistSource != "" {
		def(&o.ConflistName, filepath.Base(o.ConflistSource))
	}
	def(&o.NodeConfig, settings.DefaultConfig)
	def(&o.RouterConfig, config.DefaultPath)
	def(&o.Kubeconfig, settings.DefaultKubeconfig)
	def(&o.StateDir, settings.DefaultStateDir)
	def(&o.LogFile, settings.DefaultLogFile)
	def(&o.Namespace, settings.DefaultNamespace)
	def(&o.NodeName, o.getenv(EnvNodeName))
	def(&o.NodeName, o.getenv(settings.EnvNodeName))
	def(&o.TokenFile, filepath.Join(DefaultServiceAccountDir, "token"))
	def(&o.CAFile, filepath.Join(DefaultServiceAccountDir, "ca.crt"))
	return o
}

// resolve checks the host paths and joins them under the root.
func (o Options) resolve() (paths, error) {
	if o.Root != "" && !filepath.IsAbs(o.Root) {
		return paths{}, fmt.Errorf("--root %q must be an absolute path", o.Root)
	}
	var p paths
	for _, f := range []struct {
		dst  *string
		val  string
		flag string
	}{
		{&p.cniBin, o.CNIBinDir, "--cni-bin-dir"},
		{&p.cniConf, o.CNIConfDir, "--cni-conf-dir"},
		{&p.nodeConfig, o.NodeConfig, "--node-config"},
		{&p.routerConfig, o.RouterConfig, "--router-config"},
		{&p.kubeconfig, o.Kubeconfig, "--node-kubeconfig"},
		{&p.stateDir, o.StateDir, "--state-dir"},
		{&p.logFile, o.LogFile, "--log-file"},
	} {
		if !filepath.IsAbs(f.val) {
			return paths{}, fmt.Errorf("%s %q must be an absolute path (it is joined under --root)", f.flag, f.val)
		}
		*f.dst = filepath.Join("/", o.Root, f.val)
	}
	p.token = filepath.Join(filepath.Dir(p.kubeconfig), TokenName)
	p.manifest = filepath.Join(p.stateDir, ManifestName)
	return p, nil
}

// validateNode checks what install writes into the node settings.
func (o Options) validateNode() error {
	if o.NodeName == "" {
		return fmt.Errorf("node name is not set: pass --node-name or set %s (the DaemonSet sets it from spec.nodeName) or %s", EnvNodeName, settings.EnvNodeName)
	}
	if errs := validation.IsDNS1123Subdomain(o.NodeName); len(errs) > 0 {
		return fmt.Errorf("node name %q is not a Kubernetes node name: %s", o.NodeName, strings.Join(errs, "; "))
	}
	if o.NodeTokenSeconds != 0 && o.NodeTokenSeconds < minTokenSeconds {
		return fmt.Errorf("--node-token-seconds %d: want 0 (use the pod's token) or at least %d (the shortest token the API server issues)", o.NodeTokenSeconds, minTokenSeconds)
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return fmt.Errorf("--namespace %q is not a namespace name: %s", o.Namespace, strings.Join(errs, "; "))
	}
	return nil
}
