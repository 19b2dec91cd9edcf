package controller

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

// bootGuard bounds a qemu guest's boot and poweroff (TCG on a loaded
// machine is slow); it is never a speed limit.
const bootGuard = 3 * time.Minute

var (
	guestOnce   sync.Once
	guestAssets *vm.GuestAssets
	guestErr    error
)

// qemuGuests returns the guests' kernel and initramfs, or nil and why qemu
// guests cannot run here; t fails on any other error.
func qemuGuests(t *testing.T) (*vm.GuestAssets, string) {
	t.Helper()
	if err := vm.Available(); err != nil {
		return nil, err.Error()
	}
	guestOnce.Do(func() {
		var dir string
		if dir, guestErr = harness.SharedTempDir("galactic-controller-vm-"); guestErr == nil {
			guestAssets, guestErr = vm.EnsureGuestAssets(dir, os.Stderr)
		}
	})
	if errors.Is(guestErr, vm.ErrNoKernelSource) {
		return nil, guestErr.Error()
	}
	if guestErr != nil {
		t.Fatal(guestErr)
	}
	return guestAssets, ""
}

// addGuest runs the inline tap attachment's ADD on n, as a VMM's runtime
// does, and boots a qemu guest on the tap with the result's addresses.
// t's cleanup kills qemu.
func addGuest(t *testing.T, env *harness.Env, n *harness.Node, a inline, as *vm.GuestAssets) (*harness.Netns, *vm.Guest) {
	t.Helper()
	c := harness.NewContainer(t)
	n.WriteConflist(t, a.conflist())
	out, err := n.CNITool("add", a.network(), c, "net0")
	if err != nil {
		t.Fatalf("ADD %s on %s: %v %s", a.name, n.Name, err, out)
	}
	env.ForgetAttachment(t, a.vpc, a.name)
	res := &current.Result{}
	if err := json.Unmarshal([]byte(out), res); err != nil {
		t.Fatalf("the ADD result of %s: %v\n%s", a.name, err, out)
	}
	o := vm.GuestOptions{Netns: n.Netns.Name, MemoryMB: 128}
	if err := o.FromResult(res); err != nil {
		t.Fatal(err)
	}
	g, took, err := as.Boot(context.Background(), o, bootGuard)
	if err != nil {
		t.Fatalf("booting a guest on %s in %s: %v", o.Tap, n.Name, err)
	}
	t.Cleanup(g.Kill)
	t.Logf("guest %s (qemu pid %d, %s) on tap %s in %s ready %s after qemu started", a.name, g.Pid, g.Accel, o.Tap, n.Name, took.Round(time.Millisecond))
	return c, g
}
