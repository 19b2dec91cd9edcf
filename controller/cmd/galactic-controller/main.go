// Command galactic-controller is galactic's cluster controller: it
// allocates the VNIs of VPCs and the addresses of VPCAttachments, protects
// attachments in use, carries out their reclaim policy and shows their
// holder's state in their status. Run it as a Deployment of two or more
// replicas: one leads, the others stand by with warm caches.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/galactic-cni/galactic/controller"
	"github.com/galactic-cni/galactic/pkg/client"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "galactic-controller:", err)
		os.Exit(1)
	}
}

// commands are the subcommands; the first argument names one unless it is
// a flag, and "run" is the default.
var commands = map[string]func(args []string, stdout io.Writer) error{
	"run":   serve,
	"adopt": adopt,
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage: galactic-controller [run] [flags]
           reconcile VPCs and VPCAttachments (the default)
       galactic-controller adopt --namespace NS [--vpc-networks VPC=CIDR[,CIDR...][,VPC=CIDR...]] [flags]
           make VPCs and VPCAttachments of the inline attachments that nodes advertise
       galactic-controller help
           this text
Run "galactic-controller <command> -h" for a command's flags.`)
}

func run(args []string, stdout io.Writer) error {
	verb := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		verb, args = args[0], args[1:]
	} else if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		verb = "help"
	}
	if verb == "help" {
		usage(stdout)
		return nil
	}
	cmd, ok := commands[verb]
	if !ok {
		usage(os.Stderr)
		return fmt.Errorf("unknown command %q", verb)
	}
	return cmd(args, stdout)
}

// runFlags are the flags of run.
type runFlags struct {
	kubeconfig, namespace, metricsAddress, identity string
	leaderElect                                     bool
	leaseDuration, renewDeadline, retryPeriod       time.Duration
	vniRange                                        string
	vniMin, vniMax                                  int32
	vniHold, resync, statusBatch                    time.Duration
	workers                                         int
	qps                                             float64
	burst                                           int
	profiling                                       bool
}

func parseRunFlags(args []string) (*runFlags, error) {
	f := &runFlags{}
	fs := flag.NewFlagSet("galactic-controller run", flag.ContinueOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the pod's service account (in-cluster)")
	fs.StringVar(&f.namespace, "namespace", "galactic-system", "galactic's namespace: the leader election lease, the handoff leases and the advertisements")
	fs.StringVar(&f.metricsAddress, "metrics-address", ":9403", "address of /metrics, /healthz and /readyz; empty disables them")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "compete for the leader lease and reconcile only while holding it; false: reconcile at once (a single replica)")
	fs.StringVar(&f.identity, "identity", "", "holder identity in the leader lease (default: the hostname and a random suffix)")
	fs.DurationVar(&f.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after it last saw the leader renew before it takes over")
	fs.DurationVar(&f.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader tries to renew before it gives up leading (and exits)")
	fs.DurationVar(&f.retryPeriod, "leader-elect-retry-period", 500*time.Millisecond, "how often the leader renews and a standby tries to acquire")
	fs.StringVar(&f.vniRange, "vni-range", fmt.Sprintf("%d-%d", controller.DefaultVNIMin, controller.DefaultVNIMax), "VNIs allocated to VPCs without spec.vni, as <first>-<last> within 1-16777215")
	fs.DurationVar(&f.vniHold, "vni-hold", controller.DefaultVNIHold, "how long a deleted VPC's VNI stays out of use (and longer while an advertisement carries it)")
	fs.DurationVar(&f.resync, "resync", 10*time.Minute, "every object is reconciled at least this often; 0: only on change")
	fs.DurationVar(&f.statusBatch, "status-batch-period", controller.DefaultStatusBatch, "how long a lease's or advertisement's change waits before it is written into its VPCAttachment's status (changes within it make one write); 0: at once")
	fs.IntVar(&f.workers, "workers", controller.DefaultWorkers, "attachments reconciled in parallel")
	fs.Float64Var(&f.qps, "kube-api-qps", 1000, "API requests per second the controller makes at most, sustained")
	fs.IntVar(&f.burst, "kube-api-burst", 2000, "API requests the controller makes at most in a burst")
	fs.BoolVar(&f.profiling, "profiling", false, "also serve Go's profiles (/debug/pprof/) on --metrics-address")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	lo, hi, ok := strings.Cut(f.vniRange, "-")
	a, errA := strconv.ParseInt(lo, 10, 32)
	b, errB := strconv.ParseInt(hi, 10, 32)
	if !ok || errA != nil || errB != nil || a < 1 || b > controller.DefaultVNIMax || a > b {
		return nil, fmt.Errorf("--vni-range %q: want <first>-<last> with 1 <= first <= last <= %d, such as 100000-16777215", f.vniRange, controller.DefaultVNIMax)
	}
	f.vniMin, f.vniMax = int32(a), int32(b)
	if f.vniHold < 0 {
		return nil, fmt.Errorf("--vni-hold %s: must not be negative", f.vniHold)
	}
	if f.resync < 0 {
		return nil, fmt.Errorf("--resync %s: must not be negative", f.resync)
	}
	if f.statusBatch < 0 {
		return nil, fmt.Errorf("--status-batch-period %s: must not be negative", f.statusBatch)
	}
	if f.workers < 1 {
		return nil, fmt.Errorf("--workers %d: must be at least 1", f.workers)
	}
	if f.namespace == "" {
		return nil, errors.New("--namespace must not be empty")
	}
	if f.leaderElect {
		// client-go's own rules, said here with the flags' names.
		switch {
		case f.retryPeriod <= 0:
			return nil, fmt.Errorf("--leader-elect-retry-period %s: must be positive", f.retryPeriod)
		case f.renewDeadline <= time.Duration(leaderelection.JitterFactor*float64(f.retryPeriod)):
			return nil, fmt.Errorf("--leader-elect-renew-deadline %s must be longer than %.1f times --leader-elect-retry-period %s", f.renewDeadline, leaderelection.JitterFactor, f.retryPeriod)
		case f.leaseDuration <= f.renewDeadline:
			return nil, fmt.Errorf("--leader-elect-lease-duration %s must be longer than --leader-elect-renew-deadline %s", f.leaseDuration, f.renewDeadline)
		}
	}
	if f.identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--identity: no hostname to default to: %w", err)
		}
		suffix := make([]byte, 4)
		_, _ = rand.Read(suffix)
		f.identity = host + "_" + hex.EncodeToString(suffix)
	}
	return f, nil
}

// gcPercent is the Go heap's growth between collections unless GOGC says
// otherwise.
const gcPercent = 50

func serve(args []string, _ io.Writer) error {
	f, err := parseRunFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "galactic-controller", "identity", f.identity)
	if os.Getenv("GOGC") == "" {
		// The heap is mostly the informers' caches, which change little
		// once loaded: a burst of events may grow it by half before a
		// collection instead of doubling it, for a little more CPU.
		debug.SetGCPercent(gcPercent)
	}
	cfg, err := client.LoadConfig(f.kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "galactic-controller"
	cfg.QPS, cfg.Burst = float32(f.qps), f.burst
	cs, err := client.New(cfg)
	if err != nil {
		return err
	}
	c, err := controller.New(controller.Options{
		Clients: cs, Namespace: f.namespace, VNIMin: f.vniMin, VNIMax: f.vniMax, VNIHold: f.vniHold,
		Workers: f.workers, Resync: f.resync, StatusBatch: f.statusBatch, Log: log,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A leader that stops renewing fails /healthz after this much grace.
	health := leaderelection.NewLeaderHealthzAdaptor(f.renewDeadline)
	if f.metricsAddress != "" {
		ln, err := net.Listen("tcp", f.metricsAddress)
		if err != nil {
			return fmt.Errorf("--metrics-address: %w", err)
		}
		var h http.Handler = c.Handler(func(r *http.Request) error { return health.Check(r) })
		if f.profiling {
			mux := http.NewServeMux()
			mux.Handle("/", h)
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			h = mux
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	log.Info("starting", "namespace", f.namespace, "leaderElect", f.leaderElect, "vniRange", f.vniRange, "workers", f.workers)
	if !f.leaderElect {
		c.Start(ctx)
		c.Lead(ctx)
		return nil
	}
	return c.RunElected(ctx, controller.Election{
		Config: cfg, Namespace: f.namespace, Identity: f.identity,
		LeaseDuration: f.leaseDuration, RenewDeadline: f.renewDeadline, RetryPeriod: f.retryPeriod,
	}, health)
}

// adoptFlags are the flags of adopt.
type adoptFlags struct {
	kubeconfig, namespace, galacticNamespace string
	vpcNetworks                              []string
	dryRun                                   bool
	wait                                     time.Duration
}

func parseAdoptFlags(args []string) (*adoptFlags, controller.VPCNetworks, error) {
	f := &adoptFlags{}
	fs := flag.NewFlagSet("galactic-controller adopt", flag.ContinueOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file of a cluster administrator; empty: $KUBECONFIG, else in-cluster")
	fs.StringVar(&f.namespace, "namespace", "", "the tenant namespace the VPCs and VPCAttachments are made in (required)")
	fs.StringVar(&f.galacticNamespace, "galactic-namespace", "galactic-system", "galactic's namespace: the nodes' handoff leases and advertisements")
	fs.Func("vpc-networks", "the inline VPCs to adopt and their networks: blue=10.20.0.0/16,fd20::/48,red=10.30.0.0/16 (repeatable); a VPC an earlier run made keeps its own", func(v string) error {
		f.vpcNetworks = append(f.vpcNetworks, v)
		return nil
	})
	fs.BoolVar(&f.dryRun, "dry-run", false, "print what would be made and write nothing")
	fs.DurationVar(&f.wait, "wait", 2*time.Minute, "how long to wait for galactic-controller to make the attachments Ready before their leases and advertisements are labelled")
	if err := fs.Parse(args); err != nil {
		return nil, controller.VPCNetworks{}, err
	}
	if fs.NArg() > 0 {
		return nil, controller.VPCNetworks{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.namespace == "" {
		return nil, controller.VPCNetworks{}, errors.New("--namespace is required: the tenant namespace to adopt the inline attachments into")
	}
	if errs := validation.IsDNS1123Label(f.namespace); len(errs) > 0 {
		return nil, controller.VPCNetworks{}, fmt.Errorf("--namespace %q is not a namespace name: %s", f.namespace, strings.Join(errs, "; "))
	}
	if f.galacticNamespace == "" {
		return nil, controller.VPCNetworks{}, errors.New("--galactic-namespace must not be empty")
	}
	if f.wait <= 0 {
		return nil, controller.VPCNetworks{}, fmt.Errorf("--wait %s: must be positive", f.wait)
	}
	nets, err := controller.ParseVPCNetworks(f.vpcNetworks)
	if err != nil {
		return nil, controller.VPCNetworks{}, err
	}
	return f, nets, nil
}

func adopt(args []string, stdout io.Writer) error {
	f, nets, err := parseAdoptFlags(args)
	if err != nil {
		return err
	}
	if f.kubeconfig == "" {
		// An administrator's tool, run where kubectl is.
		f.kubeconfig = os.Getenv("KUBECONFIG")
	}
	cfg, err := client.LoadConfig(f.kubeconfig)
	if err != nil {
		return err
	}
	cfg.UserAgent = "galactic-controller"
	cs, err := client.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return controller.Adopt(ctx, controller.AdoptOptions{
		Clients: cs, Namespace: f.namespace, GalacticNamespace: f.galacticNamespace,
		Networks: nets, DryRun: f.dryRun, Wait: f.wait, Out: stdout,
	})
}
