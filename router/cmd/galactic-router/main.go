// Command galactic-router is the node's BGP speaker: it announces this
// node's BGPAdvertisements to the fabric as EVPN type-5 routes and installs
// the other nodes' routes over VXLAN. `galactic-router drain` withdraws
// everything on purpose.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/liveness"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/router"
	"github.com/galactic-cni/galactic/router/config"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "galactic-router:", err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage: galactic-router [run] [flags]   serve (the default)
       galactic-router drain [flags]   withdraw this node's routes and remove what the router installed`)
}

func run(args []string, getenv func(string) string, stdout io.Writer) error {
	verb := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		verb, args = args[0], args[1:]
	}
	if verb == "help" {
		usage(stdout)
		return nil
	}
	fs := flag.NewFlagSet("galactic-router "+verb, flag.ContinueOnError)
	fs.Usage = func() {
		usage(fs.Output())
		fmt.Fprintln(fs.Output(), "\nflags:")
		fs.PrintDefaults()
	}
	cfgPath := fs.String("config", "", "router config (default $"+config.EnvConfig+" or "+config.DefaultPath+")")
	resync := fs.Duration("resync", 30*time.Second, "longest time the kernel and the status go unchecked without an event")
	ribWait := fs.Duration("rib-wait", 30*time.Second, "how long a started router waits for every peer's End-of-RIB once one has sent it, before judging the routes it found")
	bootIDFile := fs.String("boot-id-file", router.BootIDPath, "where the kernel's boot ID is read: a new one means the node rebooted and saved paths are not replayed")
	nodeConfig := fs.String("node-config", "", "node settings file (default $"+settings.EnvConfig+" or "+settings.DefaultConfig+")")
	underlay := fs.String("underlay", "", "the underlay address when the config has none (a reflector set's shared config takes each host's)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg, err := config.LoadWithUnderlay(config.Path(*cfgPath, getenv), *underlay)
	if err != nil {
		return err
	}
	if cfg.Role == config.RoleReflector {
		// A reflector reads no node settings: it has no node, kernel state
		// or API access.
		if verb != "run" {
			return fmt.Errorf("%s: not a command of role %q (only run)", verb, config.RoleReflector)
		}
		return serveReflector(cfg)
	}
	if *nodeConfig != "" {
		prev := getenv
		getenv = func(k string) string {
			if k == settings.EnvConfig {
				return *nodeConfig
			}
			return prev(k)
		}
	}
	node, err := settings.Load(getenv)
	if err != nil {
		return err
	}
	switch verb {
	case "run":
		if *resync <= 0 {
			return fmt.Errorf("--resync must be positive, got %s", *resync)
		}
		if *ribWait <= 0 {
			return fmt.Errorf("--rib-wait must be positive, got %s", *ribWait)
		}
		return serve(cfg, node, *resync, *ribWait, *bootIDFile)
	case "drain":
		return drain(node, stdout)
	}
	usage(os.Stderr)
	return fmt.Errorf("unknown command %q", verb)
}

func serve(cfg *config.Config, node settings.Node, resync, ribWait time.Duration, bootIDFile string) error {
	if err := node.RequireNodeName(); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "galactic-router", "node", node.NodeName)
	logMemoryLimit(log)
	kc, err := client.LoadConfig(node.Kubeconfig)
	if err != nil {
		return err
	}
	kc.UserAgent = "galactic-router"
	// Status writes come in bursts (a start, a peer going down); they are
	// written apart from routing, so a higher limit only shortens how
	// long conditions lag.
	kc.QPS, kc.Burst = 20, 40
	cs, err := client.New(kc)
	if err != nil {
		return err
	}
	d, err := router.New(router.Options{
		Config: cfg, Node: node.NodeName, Namespace: node.Namespace, StateDir: node.StateDir,
		Adverts: cs.BGPAdvertisements(node.Namespace), Leases: cs.Leases(node.Namespace),
		LeaseSelector: names.HolderNodeSelector(node.NodeName), Judge: handoff.Availability,
		Attachments: cs.VPCAttachments(""),
		Live:        liveness.Netns, Log: log, Resync: resync, RIBWait: ribWait,
		BootID: func() (string, error) {
			b, err := os.ReadFile(bootIDFile)
			return strings.TrimSpace(string(b)), err
		},
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.MetricsAddress != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metricsAddress: %w", err)
		}
		metrics := &http.Server{Handler: d.MetricsHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = metrics.Serve(ln) }()
	}
	ln, err := router.ListenControl(node.StateDir)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	srv := &http.Server{Handler: d.ControlHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	// A stop signal returns from Run without withdrawing or sending a
	// Cease: the process exits and its peers keep the routes as a
	// graceful restart.
	err = d.Run(ctx)
	// Lets a drain request that ended Run get its answer.
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	return err
}

// drain asks the running router (on its control socket) to drain. With
// none running it removes what a router installed in the kernel and its
// saved paths itself; peers then drop the routes when their session is
// gone for good (at once without graceful restart, else after restartSeconds).
func drain(node settings.Node, stdout io.Writer) error {
	sock := router.ControlSocket(node.StateDir)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return router.DialControl(node.StateDir)
		},
	}}
	resp, err := c.Post("http://galactic-router/drain", "text/plain", nil)
	if err == nil {
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the running router could not drain: %s", strings.TrimSpace(string(body)))
		}
		fmt.Fprintln(stdout, "drained: every route withdrawn, the router's kernel state removed; the router has exited")
		return nil
	}
	var op *net.OpError
	if !errors.As(err, &op) {
		return err
	}
	if err := errors.Join(router.RemoveKernelState(), router.NewStore(node.StateDir).Forget()); err != nil {
		return fmt.Errorf("no router runs (%s); removing its state: %w", sock, err)
	}
	fmt.Fprintln(stdout, "no router runs: removed its VXLAN devices, routes and saved paths; peers drop its routes once its sessions are gone")
	return nil
}

func serveReflector(cfg *config.Config) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "galactic-router", "role", config.RoleReflector)
	logMemoryLimit(log)
	r := router.NewReflector(cfg, log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.MetricsAddress != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metricsAddress: %w", err)
		}
		metrics := &http.Server{Handler: r.MetricsHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = metrics.Serve(ln) }()
	}
	// A stop signal exits without a Cease: clients keep the reflected
	// routes as a graceful restart until the reflector is back.
	return r.Run(ctx)
}
