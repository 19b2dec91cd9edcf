package vmm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

func TestMain(m *testing.M) { harness.Main(m) }

const (
	vpc = "vmm"
	mtu = 1400
	// hangGuard bounds waits that only end when something happens (a boot
	// under TCG on a loaded machine, a poweroff); it is never a speed limit.
	hangGuard = 3 * time.Minute
)

var (
	assetsOnce sync.Once
	assets     *vm.GuestAssets
	assetsErr  error
	assetsDir  string
)

// setup returns the environment and the guest's kernel and initramfs, or
// skips saying why qemu guests cannot run here.
func setup(t *testing.T) (*harness.Env, *vm.GuestAssets) {
	t.Helper()
	harness.RequireRoot(t)
	if err := vm.Available(); err != nil {
		t.Skipf("the VMM tests run qemu guests: %v", err)
	}
	assetsOnce.Do(func() {
		if assetsDir, assetsErr = harness.SharedTempDir("galactic-vmm-"); assetsErr == nil {
			assets, assetsErr = vm.EnsureGuestAssets(assetsDir, os.Stderr)
		}
	})
	if errors.Is(assetsErr, vm.ErrNoKernelSource) {
		t.Skipf("the VMM tests boot a Debian kernel: %v", assetsErr)
	}
	if assetsErr != nil {
		t.Fatal(assetsErr)
	}
	return harness.Setup(t), assets
}

// routingNode is a node with IP forwarding on, which traffic between two
// workloads on it needs.
func routingNode(t *testing.T, env *harness.Env, name string) *harness.Node {
	t.Helper()
	node := env.NewNode(t, name)
	node.EnableForwarding(t)
	return node
}

// newAttachment is one attachment of a test, in tap or veth mode, with
// table routing (this kernel has no VRF) and the handoff on with
// leaseSeconds, or off for 0. Its lease and advertisements go when the
// test ends (the API server is shared by the package).
func newAttachment(t *testing.T, env *harness.Env, name, mode string, leaseSeconds int, addresses ...string) harness.Attachment {
	t.Helper()
	env.ForgetAttachment(t, vpc, name)
	a := harness.Attachment{VPC: vpc, Name: name, Mode: mode, Addresses: addresses, MTU: mtu}
	if mode == names.ModeVeth {
		a.IfName = "eth0"
	}
	if leaseSeconds > 0 {
		a.Handoff = &harness.Handoff{WaitSeconds: 30, LeaseSeconds: leaseSeconds}
	}
	return a
}

// boot starts qemu inside node on the tap the ADD result names, telling
// the guest the attachment's addresses and the gateways the result
// returned, and waits until the guest is ready. t's cleanup kills qemu.
func boot(t *testing.T, as *vm.GuestAssets, node *harness.Node, res *current.Result) *vm.Guest {
	t.Helper()
	o := vm.GuestOptions{Netns: node.Netns.Name, MTU: mtu}
	if err := o.FromResult(res); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("GALACTIC_VM_CONSOLE") != "" {
		o.Console = os.Stderr
	}
	g, took, err := as.Boot(context.Background(), o, hangGuard)
	if err != nil {
		t.Fatalf("booting a guest on %s in %s: %v", o.Tap, node.Name, err)
	}
	t.Cleanup(g.Kill)
	t.Logf("guest (qemu pid %d, %s) on %s in %s ready %s after qemu started", g.Pid, g.Accel, o.Tap, node.Name, took.Round(time.Millisecond))
	return g
}

func poweroff(t *testing.T, g *vm.Guest) {
	t.Helper()
	if err := g.Poweroff(hangGuard); err != nil {
		t.Fatalf("powering the guest off: %v\nconsole:\n%s", err, g.Console())
	}
}

// checkServes pings each address from the workload netns and has the
// guest's echo service echo a line over each.
func checkServes(t *testing.T, from *harness.Netns, g *vm.Guest, addrs []netip.Addr) {
	t.Helper()
	for _, addr := range addrs {
		if err := from.Ping(addr); err != nil {
			t.Fatalf("the guest does not answer ping on %s: %v\nconsole:\n%s\nguest status:\n%s", addr, err, g.Console(), g.Status(10*time.Second))
		}
		if err := echo(from, addr); err != nil {
			t.Fatalf("the guest's echo service on %s: %v\nconsole:\n%s", addr, err, g.Console())
		}
	}
}

// echo sends a line to the guest's echo service and expects it back. The
// service starts as the guest reports ready, so a refused connection is
// retried a few times.
func echo(from *harness.Netns, addr netip.Addr) error {
	want := "galactic " + addr.String()
	var last error
	for attempt := 0; attempt < 20; attempt++ {
		last = from.Do(func() error {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(vm.EchoPort)), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := fmt.Fprintln(c, want); err != nil {
				return err
			}
			got, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return err
			}
			if strings.TrimSpace(got) != want {
				return fmt.Errorf("echoed %q, want %q", got, want)
			}
			return nil
		})
		if last == nil || !errors.Is(last, syscall.ECONNREFUSED) {
			return last
		}
		time.Sleep(250 * time.Millisecond)
	}
	return last
}

// keptLine returns the GC's "kept detached tap" line about tap, "" when none.
func keptLine(out, tap string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "kept detached tap") && strings.Contains(l, tap) {
			return l
		}
	}
	return ""
}
