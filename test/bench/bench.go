package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
)

// Options size a run.
type Options struct {
	// Quick runs fewer iterations and smaller sizes, for development.
	Quick bool
	// Iterations and Warmup are the chain latency loop's (per config).
	Iterations, Warmup int
	// ProcessRuns is how often each direct plugin invocation is repeated.
	ProcessRuns int
	// GCSizes are the tap counts of the GC scaling table; GCPasses the
	// steady passes timed at each.
	GCSizes  []int
	GCPasses int
	// GCProfile, if set, receives a CPU profile of one in-process pass at
	// the largest size.
	GCProfile string
	// ChurnPairs ADD/DEL pairs run ChurnParallelism at a time.
	ChurnPairs, ChurnParallelism int
	// Only, when set, names the one section to run (a step name such as
	// "VM boot"), for development; the report then lacks the others.
	Only string
	// VMBoots is how many guests are booted per accelerator.
	VMBoots int
	// CRIIterations and CRIWarmup are the pod sandbox loop's (per node).
	CRIIterations, CRIWarmup int
	// Out is the Markdown file written; empty writes none.
	Out string
	// AllowDirty writes the report to DefaultOut from a tree with
	// uncommitted changes, which Run refuses otherwise.
	AllowDirty bool
}

// DefaultOut is the report's place in the repository.
func DefaultOut() string { return filepath.Join(harness.RepoRoot(), "docs", "benchmarks.md") }

// DefaultOptions are what `make bench` runs; quick ones are for development.
func DefaultOptions(quick bool) Options {
	if quick {
		return Options{Quick: true, Iterations: 30, Warmup: 5, ProcessRuns: 5, GCSizes: []int{100, 1000}, GCPasses: 1, ChurnPairs: 80, ChurnParallelism: 8, VMBoots: 2, CRIIterations: 8, CRIWarmup: 2}
	}
	return Options{Iterations: 200, Warmup: 20, ProcessRuns: 20, GCSizes: []int{100, 1000, 5000}, GCPasses: 3, ChurnPairs: 500, ChurnParallelism: 8, VMBoots: 3, CRIIterations: 40, CRIWarmup: 5}
}

// bench is one run: the environment, the counting proxy and the results.
type bench struct {
	ctx   context.Context
	opts  Options
	out   io.Writer
	env   *harness.Env
	dir   string
	proxy *Proxy
	start time.Time
	undo  []func()
	res   *Results
}

// Run builds the binaries, starts a control plane, runs every benchmark
// and writes the report to opts.Out. Everything it creates is removed
// before it returns.
func Run(ctx context.Context, out io.Writer, opts Options) (res *Results, err error) {
	if filepath.Clean(opts.Out) == DefaultOut() && !opts.AllowDirty {
		dirty, err := DirtyFiles()
		if err != nil {
			return nil, err
		}
		if len(dirty) > 0 {
			return nil, fmt.Errorf("the tree differs from its commit (%s): docs/benchmarks.md is the report of a commit, so commit first; -out writes elsewhere (the report then says it is of no commit), -allow-dirty overrides", strings.Join(dirty, ", "))
		}
	}
	b := &bench{ctx: ctx, opts: opts, out: out, start: time.Now(), res: &Results{Options: opts, Date: time.Now()}}
	defer b.unwind(0)
	b.res.Machine = readMachine()
	b.say("machine: %d CPUs (%s), kernel %s, load average %s", b.res.Machine.CPUs, b.res.Machine.Model, b.res.Machine.Kernel, b.res.Machine.LoadStart)
	b.say("building binaries and starting etcd + kube-apiserver")
	if b.env, err = harness.NewEnv(b.ctx, out); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, b.env.Close)
	if b.dir, err = os.MkdirTemp("", "galactic-bench-"); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, func() { os.RemoveAll(b.dir) })
	if b.proxy, err = StartProxy(b.env.CP, b.dir); err != nil {
		return nil, err
	}
	b.undo = append(b.undo, b.proxy.Close)
	b.res.Versions = readVersions()

	for _, s := range b.steps() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if opts.Only != "" && s.name != opts.Only {
			continue
		}
		b.say("== %s", s.name)
		st := settle(s.name)
		b.res.Machine.Sections = append(b.res.Machine.Sections, st)
		b.say("the CPUs were %.0f%% busy as it began (after waiting %s for them to quieten)", 100*st.Busy, st.Waited.Round(time.Second))
		t := time.Now()
		mark := len(b.undo)
		if err := s.run(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		// What a section made (nodes, a cluster, routers, fabrics) goes
		// with it, so none of it loads the machine or the API under the
		// sections after it.
		b.unwind(mark)
		b.say("%s took %s", s.name, time.Since(t).Round(time.Second))
	}
	if b.res.Unattributed = b.proxy.Unattributed(); b.res.Unattributed != nil {
		b.say("WARNING: API requests without a galactic program's user agent: %v; the per-program counts miss them", b.res.Unattributed)
	}
	b.res.Machine.LoadEnd = loadAverage()
	b.res.Took = time.Since(b.start)
	if opts.Out != "" {
		if err := os.WriteFile(opts.Out, []byte(Render(b.res)), 0o644); err != nil {
			return nil, err
		}
		b.say("wrote %s", opts.Out)
	}
	return b.res, nil
}

// step is one section of the run.
type step struct {
	name string
	run  func() error
}

// steps are the sections in the order they run.
func (b *bench) steps() []step {
	return []step{
		{"chain latency", b.chainLatency},
		{"API requests per operation", b.apiCounts},
		{"plugin process cost", b.processCost},
		{"churn", b.churn},
		{"GC pass scaling", b.gcScaling},
		{"VM boot", b.vmBoot},
		{"pod sandbox start", b.criSandbox},
		{"Routing", b.routing},
		{"live migration", b.liveMigration},
		{"cluster pod start", b.clusterPodStart},
		{"tenant isolation", b.isolation},
		{"route scale", b.routeScale},
		// Last: the attachments it leaves go with the control plane.
		{"controller", b.controllerBench},
	}
}

// SectionNames are the names -only takes, quoted, in the order they run.
func SectionNames() string {
	var names []string
	for _, s := range (&bench{}).steps() {
		names = append(names, strconv.Quote(s.name))
	}
	return strings.Join(names, ", ")
}

// unwind undoes, last first, what was registered after the first mark
// entries.
func (b *bench) unwind(mark int) {
	for i := len(b.undo) - 1; i >= mark; i-- {
		b.undo[i]()
	}
	b.undo = b.undo[:mark]
}

func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.out, "[%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// node is a harness node whose kubeconfig can be switched between the
// API server itself and the counting proxy.
type node struct {
	*harness.Node
	direct string
}

// newNode creates a node that reaches both the API server and the proxy;
// it starts out talking to the API server directly.
func (b *bench) newNode(name string) (*node, error) {
	dir := filepath.Join(b.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	hn, err := b.env.CreateNode(name, dir)
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, hn.Close)
	fwd, err := harness.NewForwarder(hn.Path, b.proxy.Port)
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, fwd.Close)
	n := &node{Node: hn, direct: filepath.Join(dir, "kubeconfig.direct")}
	if err := copyFile(hn.Settings.Kubeconfig, n.direct); err != nil {
		return nil, err
	}
	return n, nil
}

// viaProxy points the node's kubeconfig at the counting proxy (true) or
// at the API server (false).
func (n *node) viaProxy(b *bench, on bool) error {
	src := n.direct
	if on {
		src = b.proxy.Kubeconfig
	}
	return copyFile(src, n.Settings.Kubeconfig)
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o600)
}

// container creates a container network namespace removed at the end.
func (b *bench) container() (*harness.Netns, error) {
	c, err := harness.CreateNetns("c")
	if err != nil {
		return nil, err
	}
	b.undo = append(b.undo, c.Delete)
	return c, nil
}

// Exec is one process run: its wall time from fork to reaped, its CPU
// time and (from runRSS only) its peak RSS.
type Exec struct {
	Start    time.Time
	Wall     time.Duration
	MaxRSSKB int64
	CPU      time.Duration
	Stdout   []byte
	Stderr   []byte
}

// run starts a program inside the node's network namespace (no `ip netns
// exec`, whose mount namespace setup would add a constant to every
// figure) and waits for it.
func (b *bench) run(n *node, stdin []byte, env []string, name string, args ...string) (Exec, error) {
	var e Exec
	err := n.Do(func() error {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), env...)
		if stdin != nil {
			cmd.Stdin = bytes.NewReader(stdin)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		e.Start = time.Now()
		err := cmd.Run()
		e.Wall = time.Since(e.Start)
		e.Stdout, e.Stderr = stdout.Bytes(), stderr.Bytes()
		if ps := cmd.ProcessState; ps != nil {
			e.CPU = ps.UserTime() + ps.SystemTime()
		}
		if err != nil {
			msg := strings.TrimSpace(stderr.String())
			if msg == "" {
				msg = strings.TrimSpace(stdout.String())
			}
			return fmt.Errorf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err, msg)
		}
		return nil
	})
	return e, err
}

// runRSS is run under /usr/bin/time, for the program's peak RSS: rusage
// from Go's own exec would report the bench's, since the child is made
// with vfork and exec keeps the larger high-water mark. The wall time
// includes time's own fork and exec.
func (b *bench) runRSS(n *node, stdin []byte, env []string, name string, args ...string) (Exec, error) {
	f, err := os.CreateTemp(b.dir, "rss-")
	if err != nil {
		return Exec{}, err
	}
	f.Close()
	defer os.Remove(f.Name())
	e, err := b.run(n, stdin, env, "/usr/bin/time", append([]string{"-f", "%M", "-o", f.Name(), name}, args...)...)
	if err != nil {
		return e, err
	}
	data, err := os.ReadFile(f.Name())
	if err != nil {
		return e, err
	}
	if _, err := fmt.Sscan(strings.TrimSpace(string(data)), &e.MaxRSSKB); err != nil {
		return e, fmt.Errorf("/usr/bin/time wrote %q: %w", data, err)
	}
	return e, nil
}

// cnitool runs the real cnitool for one verb of a network on a container.
func (b *bench) cnitool(n *node, verb, network string, c *harness.Netns, ifName string) (Exec, error) {
	env := append([]string{
		"CNI_PATH=" + n.CNIPath,
		"NETCONFPATH=" + filepath.Join(n.Dir, "net.d"),
		"CNI_IFNAME=" + ifName,
	}, n.Environ()...)
	return b.run(n, nil, env, filepath.Join(b.env.BinDir, "cnitool"), verb, network, c.Path)
}

// plugin runs one plugin binary directly, as a runtime would; with rss
// under /usr/bin/time.
func (b *bench) plugin(n *node, rss bool, binary, command string, c *harness.Netns, ifName string, conf []byte) (Exec, error) {
	env := append([]string{
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=" + harness.ContainerID(c.Path),
		"CNI_NETNS=" + c.Path,
		"CNI_IFNAME=" + ifName,
		"CNI_PATH=" + n.CNIPath,
	}, n.Environ()...)
	if rss {
		return b.runRSS(n, conf, env, filepath.Join(b.env.BinDir, binary))
	}
	return b.run(n, conf, env, filepath.Join(b.env.BinDir, binary))
}
