package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

// qemu boots a Debian kernel with a busybox init that takes the
// attachment's addresses and gateways from the kernel command line.
type qemu struct {
	assets *vm.GuestAssets
	accel  string
	why    string
}

// newQEMU prepares the guest's kernel and initramfs, or says why a guest
// cannot run here: the routing story needs a VM that answers.
func newQEMU(dir string, progress io.Writer) (*qemu, error) {
	if err := vm.Available(); err != nil {
		return nil, fmt.Errorf("the demo's VM is a qemu guest, and qemu cannot run here: %w", err)
	}
	assets, err := vm.EnsureGuestAssets(dir, progress)
	if err != nil {
		return nil, fmt.Errorf("the demo's VM needs a guest kernel: %w", err)
	}
	accel, why := vm.Accelerator()
	return &qemu{assets: assets, accel: accel, why: why}, nil
}

func (q *qemu) describe() string {
	return fmt.Sprintf("a qemu guest (virtio-net on the tap, kernel %s, %s: %s)", q.assets.Kernel.Release, q.accel, q.why)
}

// start boots a guest on the tap the ADD result names and returns once it
// is ready and answers the node.
func (q *qemu) start(ctx context.Context, n *harness.Node, res *current.Result) (*guest, error) {
	o := vm.GuestOptions{Netns: n.Netns.Name, Accel: q.accel}
	if err := o.FromResult(res); err != nil {
		return nil, err
	}
	if mtu, err := n.Run("cat", filepath.Join("/sys/class/net", o.Tap, "mtu")); err == nil {
		fmt.Sscan(mtu, &o.MTU)
	}
	g, took, err := q.assets.Boot(ctx, o, 3*time.Minute)
	if err != nil {
		return nil, err
	}
	// The node reaches its workloads through the VPC's table: a reply
	// proves the guest took its addresses and routes through the tap.
	// Unreachables are not the end: traffic that arrived before the guest
	// was up left a neighbour entry that failed, and the next probe works.
	var answered []string
	for _, p := range o.Addresses {
		if err := n.PingUntil(p.Addr(), 100*time.Millisecond, time.Now().Add(15*time.Second)); err != nil {
			g.Kill()
			rules, _ := n.Run("ip", "rule")
			routes, _ := n.Run("ip", "route", "show", "table", "all")
			neigh, _ := n.Run("ip", "neigh")
			return nil, fmt.Errorf("the guest does not answer ping on %s from the node: %w\nconsole:\n%s\nthe node's rules:\n%s\nroutes:\n%s\nneighbours:\n%s",
				p.Addr(), err, g.Console(), rules, routes, neigh)
		}
		answered = append(answered, p.Addr().String())
	}
	return &guest{g: g, summary: fmt.Sprintf("booted in %.1fs (%s), MTU %d; answers ping on %s from the node",
		took.Seconds(), g.Accel, g.MTU(), strings.Join(answered, " and "))}, nil
}

// guest is one running VM.
type guest struct {
	g       *vm.Guest
	summary string
}

func (v *guest) pid() int { return v.g.Pid }

// stop powers the guest off from its console; qemu lets go of the tap.
func (v *guest) stop() error { return v.g.Poweroff(time.Minute) }

// crash kills qemu at once, as a failing node does.
func (v *guest) crash() { v.g.Kill() }
