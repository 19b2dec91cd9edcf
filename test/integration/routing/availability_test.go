package routing

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/test/harness"
)

// report runs `galactic-cni available|unavailable` for c on n, as the
// instance's runtime would.
func report(t *testing.T, env *harness.Env, n *harness.Node, a attachment, verb string, c *harness.Netns) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.Netns.Name, filepath.Join(env.BinDir, "galactic-cni"), verb,
		"--vpc", a.VPC, "--attachment", a.Name, "--container", harness.ContainerID(c.Path))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CNI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, n.Environ()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("galactic-cni %s: %v %s", verb, err, out)
	}
}

func TestWhenAvailableRoutesOnlyWhileTheHolderReportsAvailableAndDrainsAtOnce(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := newRouted(t, env, f, "node-a")
	c := newRouted(t, env, f, "node-c")
	vm := attachment{VPC: "blue", Name: "web-0", VNI: 10100, Addresses: []string{"10.20.0.5/24"}, Handoff: true, Announce: "whenAvailable"}
	always := attachment{VPC: "blue", Name: "web-1", VNI: 10100, Addresses: []string{"10.20.0.6/24"}, Handoff: true}
	wa := add(t, a.Node, vm)
	wAlways := add(t, a.Node, always)
	wc := add(t, c.Node, attachment{VPC: "blue", Name: "client", VNI: 10100, Addresses: []string{"10.20.0.7/24"}})
	p := vm.Prefixes()[0]

	waitCondition(t, env, vm, "node-a", v1alpha1.ConditionHolderAvailable, metav1.ConditionFalse, "Acquired")
	waitCondition(t, env, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonHolderUnavailable)
	// The always attachment is routed without any report.
	waitPing(t, wc, always.Addr(false))
	time.Sleep(2 * time.Second)
	if paths := frrPaths(t, f, p); len(paths) != 0 {
		t.Fatalf("announced before the holder reported available: %+v", paths)
	}
	if err := wc.Ping(vm.Addr(false)); err == nil {
		t.Fatal("a reply from an instance that never reported available")
	}

	report(t, env, a.Node, vm, "available", wa)
	waitFRR(t, f, 1, p)
	waitPing(t, wc, vm.Addr(false))
	waitCondition(t, env, vm, "node-a", v1alpha1.ConditionHolderAvailable, metav1.ConditionTrue, "Available")
	waitCondition(t, env, vm, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)

	report(t, env, a.Node, vm, "unavailable", wa)
	eventually(t, 10*time.Second, "FRR holds the route only drained", func() error {
		paths := frrPaths(t, f, p)
		if len(paths) == 1 && strings.Contains(paths[0].Large, "65000:2:0") {
			return nil
		}
		return fmt.Errorf("%+v", paths)
	})
	// Drained paths go from the receivers' kernels at once, without the hold.
	eventually(t, 5*time.Second, "node-c's route is gone", func() error {
		if r := kernelRoute(t, c.Node, "blue", p); r != nil {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	if err := wc.Ping(vm.Addr(false)); err == nil {
		t.Fatal("a reply after the holder reported unavailable")
	}
	// A report on the always attachment changes nothing of its routing.
	report(t, env, a.Node, always, "unavailable", wAlways)
	time.Sleep(2 * time.Second)
	waitPing(t, wc, always.Addr(false))
}
