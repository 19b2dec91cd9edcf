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
	"syscall"
	"time"

	"github.com/galactic-cni/galactic/installer/install"
	"github.com/galactic-cni/galactic/pkg/settings"
)

const usage = `usage: galactic-installer <command> [flags]

commands:
  install     copy the plugins into the CNI bin dir, write the node settings and kubeconfig
  run         keep the kubeconfig's service account token fresh until SIGTERM
  uninstall   remove exactly what install wrote

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
	case "install":
		fs.StringVar(&o.SourceDir, "source-dir", "", "directory holding galactic-cni and galactic-bgp (default: the installer's own directory)")
		fs.StringVar(&o.CNIBinDir, "cni-bin-dir", install.DefaultCNIBinDir, "CNI bin dir to copy the plugins into (under --root)")
		fs.StringVar(&o.NodeName, "node-name", "", "this node's name (default $NODE_NAME, then $GALACTIC_NODE_NAME)")
		fs.StringVar(&o.LogFile, "log-file", settings.DefaultLogFile, "node log file to name in the settings (under --root); its directory is created")
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
