package bench

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/test/harness"
)

// Rows of the pod sandbox table.
const (
	CRIReference = "reference: tap + static IPAM"
	CRIGalactic  = "galactic conflist, handoff off"
	CRIHandoff   = "galactic conflist, handoff on"
)

// CRIResult is one node's `crictl runp` to sandbox ready and its
// `crictl stopp` + `rmp`, each a real crictl process against containerd.
type CRIResult struct {
	Name, Plugins  string
	RunP, Teardown Sample
	Skipped        string
}

// criNode is a node with its own containerd and the conflist of one row.
type criNode struct {
	result      *CRIResult
	node        *node
	ctd         *harness.Containerd
	annotations map[string]string
	// att is the pod's VPCAttachment; dpVPC and dpAtt its data-plane names.
	att, dpVPC, dpAtt string
}

// criConf is the conflist a node under containerd has for every pod: the
// pod's annotation names its VPCAttachment.
func criConf(handoff bool) map[string]any {
	caps := map[string]bool{netconf.CapabilityPodAnnotations: true}
	h := map[string]any{"enabled": false}
	if handoff {
		h = map[string]any{"enabled": true, "waitSeconds": 5, "leaseSeconds": 15}
	}
	return map[string]any{"cniVersion": "1.1.0", "name": "galactic", "plugins": []any{
		map[string]any{"type": "galactic-cni", "routing": "table", "mtu": benchMTU, "handoff": h, "capabilities": caps},
		map[string]any{"type": "galactic-bgp", "capabilities": caps},
	}}
}

func podAnnotations(att string) map[string]string {
	return map[string]string{netconf.AnnotationAttachment: att, netconf.AnnotationMode: names.ModeVeth}
}

// criTenant is the namespace of the galactic rows' pods, with VPC cri.
const criTenant = "bench-cri"

var criNetworks = []v1alpha1.CIDR{"10.20.0.0/24", "fd20::/64"}

// criSandbox measures pod sandbox start through CRI: three nodes, each
// with its own containerd, take turns running one pod at a time.
func (b *bench) criSandbox() error {
	rows := []struct {
		name, plugins string
		conf          map[string]any
		galactic      bool
		handoff       bool
	}{
		{CRIReference, "tap, static", referenceConf("reference"), false, false},
		{CRIGalactic, "galactic-cni, galactic-bgp", criConf(false), true, false},
		{CRIHandoff, "galactic-cni, galactic-bgp", criConf(true), true, true},
	}
	var nodes []*criNode
	// The pods name VPCAttachments that galactic-controller allocates, one
	// per pod name (each its own addresses), made before the loop.
	if err := b.startController(); err != nil {
		return err
	}
	tn, err := b.tenant(b.env.API, b.env.Kube, criTenant, "cri", criNetworks...)
	if err != nil {
		return err
	}
	for i, r := range rows {
		res := &CRIResult{Name: r.name, Plugins: r.plugins}
		b.res.CRI = append(b.res.CRI, res)
		n, err := b.newNode(fmt.Sprintf("cri-%d", i))
		if err != nil {
			return err
		}
		if err := n.WriteConflistFile(r.conf); err != nil {
			return err
		}
		ctd, err := b.env.NewContainerd(n.Node)
		if err != nil {
			res.Skipped = "containerd did not start: " + firstLineOf(err.Error())
			b.say("CRI: %s", res.Skipped)
			return nil
		}
		b.undo = append(b.undo, func() { _ = ctd.Close() })
		cn := &criNode{result: res, node: n, ctd: ctd}
		if r.galactic {
			cn.att = fmt.Sprintf("pod-%d", i)
			cn.annotations = podAnnotations(cn.att)
			a, err := tn.attach(b.ctx, cn.att)
			if err != nil {
				return err
			}
			cn.dpVPC, cn.dpAtt = a.Status.Dataplane.VPC, a.Status.Dataplane.Attachment
			// A resident pod keeps the VPC's routing table, as on a node
			// that runs workloads.
			resident := fmt.Sprintf("resident-%d", i)
			if _, err := tn.attach(b.ctx, resident); err != nil {
				return err
			}
			if _, err := ctd.RunPod(harness.PodSpec{Name: "resident", Namespace: criTenant, Annotations: podAnnotations(resident)}); err != nil {
				return err
			}
		}
		nodes = append(nodes, cn)
	}
	total := b.opts.CRIWarmup + b.opts.CRIIterations
	for i := range total {
		for j := range nodes {
			cn := nodes[(i+j)%len(nodes)]
			start := time.Now()
			id, err := cn.ctd.RunPod(harness.PodSpec{Name: fmt.Sprintf("bench-%d", i), Namespace: criTenant, Annotations: cn.annotations})
			runp := time.Since(start)
			if err != nil {
				return fmt.Errorf("%s: %w", cn.result.Name, err)
			}
			start = time.Now()
			if out, err := cn.ctd.Crictl("stopp", id); err != nil {
				return fmt.Errorf("%s: crictl stopp: %v: %s", cn.result.Name, err, out)
			}
			if out, err := cn.ctd.Crictl("rmp", id); err != nil {
				return fmt.Errorf("%s: crictl rmp: %v: %s", cn.result.Name, err, out)
			}
			teardown := time.Since(start)
			if i >= b.opts.CRIWarmup {
				cn.result.RunP = append(cn.result.RunP, runp)
				cn.result.Teardown = append(cn.result.Teardown, teardown)
			}
			if cn.att != "" {
				if err := b.checkReleased(cn.node, cn.dpVPC, cn.dpAtt); err != nil {
					return fmt.Errorf("%s: %w", cn.result.Name, err)
				}
				if out, _ := cn.node.Run("ip", "link", "show", names.HostInterface(names.ModeVeth, cn.dpVPC, cn.dpAtt)); !strings.Contains(out, "does not exist") {
					return fmt.Errorf("%s: host veth left after stopp and rmp: %s", cn.result.Name, out)
				}
			}
		}
	}
	for _, cn := range nodes {
		b.say("CRI %s: runp p50 %s, stopp+rmp p50 %s", cn.result.Name, ms(cn.result.RunP.P50()), ms(cn.result.Teardown.P50()))
	}
	return nil
}

func firstLineOf(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// criVersions reads the container runtime versions test/tools/cri pins.
func criVersions() string {
	v := modVersions(filepath.Join(harness.RepoRoot(), "test", "tools", "cri", "go.mod"))
	return fmt.Sprintf("containerd %s, runc %s, crictl (cri-tools) %s",
		v["github.com/containerd/containerd/v2"], v["github.com/opencontainers/runc"], v["sigs.k8s.io/cri-tools"])
}

func renderCRI(w *strings.Builder, r *Results) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "pod-sandbox-start")
	p("")
	p("A real containerd (%s) per node, started by the harness in the node's network namespace, runs pod sandboxes of the local pause image through CRI; each figure is one real `crictl` process: `crictl runp` until the sandbox is ready (containerd creates the netns, runs the CNI ADD of the node's one conflist, starts the pause container), and `crictl stopp` plus `crictl rmp` (DEL, stop, remove). The nodes take turns, one pod at a time, %d times each after %d warm-up rounds.", r.Versions.CRI, r.Options.CRIIterations, r.Options.CRIWarmup)
	p("")
	p("- **reference**: the upstream `tap` plugin with `static` IPAM, the same two addresses, as in %s; its tap is the sandbox's `eth0`.", r.sec("chain-latency"))
	p("- **galactic conflist**: the conflist of [under containerd](install/containerd.md), `galactic-cni` (`routing: table`) and `galactic-bgp`, each pod in namespace `bench-cri` naming its `VPCAttachment` (made Ready by galactic-controller before the loop, one address of each family) and `mode: veth` in its annotations (a pod sandbox needs its `eth0`, which tap mode does not give it); handoff off and on. Each galactic node keeps a resident pod in the VPC.")
	p("")
	ref := r.criRow(CRIReference)
	p("| conflist | plugins | runp p50 | runp p90 | runp p50 / ref | stopp+rmp p50 | stopp+rmp p90 | stopp+rmp p50 / ref |")
	p("|---|---|---|---|---|---|---|---|")
	for _, c := range r.CRI {
		if c.Skipped != "" || len(c.RunP) == 0 {
			p("| %s | %s | not measured: %s | | | | | |", c.Name, c.Plugins, c.Skipped)
			continue
		}
		ra, rt := Ratio(c.RunP.P50(), 0), Ratio(c.Teardown.P50(), 0)
		if ref != nil {
			ra, rt = Ratio(c.RunP.P50(), ref.RunP.P50()), Ratio(c.Teardown.P50(), ref.Teardown.P50())
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s |", c.Name, c.Plugins, ms(c.RunP.P50()), ms(c.RunP.P90()), ratio(ra), ms(c.Teardown.P50()), ms(c.Teardown.P90()), ratio(rt))
	}
	p("")
	if gal := r.criRow(CRIGalactic); gal != nil && ref != nil {
		p("At p50 the galactic conflist adds %s to runp and %s to stopp+rmp over the reference, the order of the chain's own extra cost measured without a runtime in %s: most of a sandbox's start and stop is containerd and runc, whatever the network.", ms(gal.RunP.P50()-ref.RunP.P50()), ms(gal.Teardown.P50()-ref.Teardown.P50()), r.sec("chain-latency"))
		p("")
	}
}

func (r *Results) criRow(name string) *CRIResult {
	for _, c := range r.CRI {
		if c.Name == name && c.Skipped == "" && len(c.RunP) > 0 {
			return c
		}
	}
	return nil
}
