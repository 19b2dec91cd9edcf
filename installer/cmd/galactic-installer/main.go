// Command galactic-installer stages galactic onto a node: install copies
// the plugins and writes the node settings and kubeconfig, run keeps the
// kubeconfig's token fresh, uninstall removes what install wrote.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/galactic-cni/galactic/installer/install"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/router/config"
)

const usage = `usage: galactic-installer <command> [flags]

commands:
  install     copy the plugins into the CNI bin dir, write the node settings, kubeconfig,
              (with --router-* flags or --router-config-file) galactic-router's config and
              (with --conflist-file) the network config list
  run         keep the kubeconfig's service account token fresh until SIGTERM
  uninstall   drain galactic-router if it is configured, then remove exactly what install wrote

Run "galactic-installer <command> -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main with its environment passed in.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("galactic-installer "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := install.Options{Getenv: getenv, Out: stdout}
	fs.StringVar(&o.Root, "root", "", "prefix for every host path (a staging or test root); empty on a real node")
	fs.StringVar(&o.NodeConfig, "node-config", settings.DefaultConfig, "node settings file to write (under --root)")
	fs.StringVar(&o.Kubeconfig, "node-kubeconfig", settings.DefaultKubeconfig, "kubeconfig to write for the plugins (under --root); its token copy goes next to it")
	fs.StringVar(&o.StateDir, "state-dir", settings.DefaultStateDir, "node state dir (under --root); holds the install record")
	fs.StringVar(&o.Namespace, "namespace", settings.DefaultNamespace, "namespace of the galactic objects")
	fs.StringVar(&o.SourceKubeconfig, "kubeconfig", "", "use this kubeconfig (flattened) instead of the pod's service account")
	fs.StringVar(&o.TokenFile, "token-file", filepath.Join(install.DefaultServiceAccountDir, "token"), "the pod's service account token")
	fs.StringVar(&o.CAFile, "ca-file", filepath.Join(install.DefaultServiceAccountDir, "ca.crt"), "the cluster CA")
	fs.StringVar(&o.APIServer, "api-server", "", "API server URL (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print what would change and write nothing")
	var interval, grace time.Duration
	switch cmd {
	case "install", "uninstall":
		fs.StringVar(&o.RouterConfig, "router-config", config.DefaultPath, "galactic-router config file to write (under --root)")
		fs.StringVar(&o.CNIConfDir, "cni-conf-dir", install.DefaultCNIConfDir, "CNI config dir the conflist goes into (under --root)")
	}
	switch cmd {
	case "install", "run":
		fs.StringVar(&o.NodeName, "node-name", "", "this node's name (default $NODE_NAME, then $GALACTIC_NODE_NAME)")
		fs.Int64Var(&o.NodeTokenSeconds, "node-token-seconds", install.DefaultNodeTokenSeconds,
			"lifetime of the node kubeconfig's token, bound to the Node and renewed at half of it; 0 copies the pod's token instead")
	}
	switch cmd {
	case "install":
		routerFlags(fs, &o)
		fs.StringVar(&o.SourceDir, "source-dir", "", "directory holding galactic-cni and galactic-bgp (default: the installer's own directory)")
		fs.StringVar(&o.CNIBinDir, "cni-bin-dir", install.DefaultCNIBinDir, "CNI bin dir to copy the plugins into (under --root)")
		fs.StringVar(&o.ConflistSource, "conflist-file", "", "network config list to install into --cni-conf-dir (a mounted ConfigMap file); empty installs none")
		fs.StringVar(&o.ConflistName, "conflist-name", "", "file name of the installed conflist, ending in .conflist (default: the --conflist-file's name)")
		fs.StringVar(&o.LogFile, "log-file", settings.DefaultLogFile, "node log file to name in the settings (under --root); its directory is created")
		fs.BoolVar(&o.RequireAttachmentObjects, "require-attachment-objects", false,
			"set requireAttachmentObjects in the node settings: the plugins refuse inline attachments (a stanza's vpc, addresses or vni), so every attachment is a VPCAttachment")
	case "run":
		fs.DurationVar(&interval, "interval", install.DefaultInterval, "how often to re-read the credential sources")
		fs.DurationVar(&grace, "grace", install.DefaultGrace, "exit non-zero after refreshing has failed for this long")
	case "uninstall":
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "galactic-installer: unknown command %q\n%s", cmd, usage)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "galactic-installer %s: unexpected arguments %q\n", cmd, fs.Args())
		return 2
	}

	var err error
	switch cmd {
	case "install":
		if o.SourceDir == "" {
			if o.SourceDir, err = ownDir(); err != nil {
				break
			}
		}
		err = install.Install(o)
	case "run":
		err = install.Run(ctx, o, interval, grace)
	case "uninstall":
		// The image keeps galactic-router next to the installer.
		if dir, derr := ownDir(); derr == nil {
			if _, serr := os.Stat(filepath.Join(dir, install.RouterBinaryName)); serr == nil {
				o.RouterBinary = filepath.Join(dir, install.RouterBinaryName)
			}
		}
		err = install.Uninstall(o)
	}
	if err != nil {
		fmt.Fprintf(stderr, "galactic-installer %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

// ownDir is the directory of the running executable, where the image keeps
// the plugins next to the installer.
func ownDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("cannot find the installer's own directory (%v): pass --source-dir", err)
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	return filepath.Dir(exe), nil
}

// routerFlags are the router.json keys install takes as flags; each is
// written only when given, so the source file or the router's default
// stands otherwise.
func routerFlags(fs *flag.FlagSet, o *install.Options) {
	r := &o.Router
	fs.StringVar(&o.RouterSource, "router-config-file", "", "router.json to start from (a mounted ConfigMap); --router-* flags override its keys")
	num := func(name, usage string, dst **int64) {
		fs.Func(name, usage, func(s string) error {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return errors.New("not a whole number")
			}
			*dst = &n
			return nil
		})
	}
	str := func(name, usage string, dst **string) {
		fs.Func(name, usage, func(s string) error {
			*dst = &s
			return nil
		})
	}
	num("router-asn", "router.json asn: this node's AS number", &r.ASN)
	str("router-underlay", "router.json underlay: this node's fabric address (BGP next hop, VXLAN source)", &r.Underlay)
	str("router-id", "router.json routerID (default: the underlay)", &r.RouterID)
	fs.Func("router-peer", "router.json peers: ADDRESS:ASN[:PORT], IPv6 as [ADDRESS]:ASN; repeat for more, replaces the file's peers", func(s string) error {
		p, err := install.ParseRouterPeer(s)
		if err != nil {
			return err
		}
		r.Peers = append(r.Peers, p)
		return nil
	})
	num("router-route-target-asn", "router.json routeTargetASN (default: asn when it fits 16 bits)", &r.RouteTargetASN)
	num("router-listen-port", "router.json listenPort; -1 accepts no sessions", &r.ListenPort)
	num("router-withdraw-hold-seconds", "router.json withdrawHoldSeconds", &r.WithdrawHoldSeconds)
	num("router-stale-routes-seconds", "router.json staleRoutesSeconds", &r.StaleRoutesSeconds)
	num("router-graceful-restart-seconds", "router.json gracefulRestart.restartSeconds", &r.RestartSeconds)
	str("router-metrics-address", "router.json metricsAddress (<ip>:<port>; empty turns it off)", &r.MetricsAddress)
}
