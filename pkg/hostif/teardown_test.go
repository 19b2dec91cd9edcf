package hostif

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/netnstest"
	"github.com/galactic-cni/galactic/pkg/routing"
)

// TeardownThen reports the interface stopped while it still exists, down
// and unrouted, with the node lock held; it reports exactly once, also when
// there is nothing left to stop.
func TestTeardownReportsTheInterfaceStoppedBeforeItIsDeleted(t *testing.T) {
	netnstest.Run(t, func() {
		h := Host{StateDir: t.TempDir()}
		spec := vethSpec(t, newContainer(t))
		att, err := h.Setup(spec)
		if err != nil {
			t.Fatal(err)
		}
		calls := 0
		err = h.TeardownThen(att.Record, func() {
			calls++
			l, err := netlink.LinkByName(spec.HostInterface())
			if err != nil {
				t.Errorf("the interface is gone before it was reported stopped: %v", err)
				return
			}
			if l.Attrs().Flags&net.FlagUp != 0 {
				t.Error("the interface is up when reported stopped")
			}
			routes, err := routedAddrs(mustTable(t, spec), l.Attrs().Index)
			if err != nil || len(routes) != 0 {
				t.Errorf("routes lead to the stopped interface: %v %v", routes, err)
			}
			if locked, _ := lockedElsewhere(h); !locked {
				t.Error("the node lock was free while the interface was stopped")
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if calls != 1 {
			t.Fatalf("stopped called %d times, want 1", calls)
		}
		if _, err := netlink.LinkByName(spec.HostInterface()); err == nil {
			t.Fatal("the interface is left after the teardown")
		}

		calls = 0
		if err := h.TeardownThen(att.Record, func() { calls++ }); err != nil {
			t.Fatalf("a second teardown: %v", err)
		}
		if calls != 1 {
			t.Fatalf("stopped called %d times with nothing to stop, want 1", calls)
		}
	})
}

func mustTable(t *testing.T, spec Spec) int {
	t.Helper()
	d, err := routing.Find(spec.VPC)
	if err != nil || d == nil {
		t.Fatalf("the routing domain of %s: %v %v", spec.VPC, d, err)
	}
	return d.Table
}

// lockedElsewhere tries the node lock without waiting; flock locks belong
// to an open file, so this process's other holding conflicts too.
func lockedElsewhere(h Host) (bool, error) {
	f, err := os.OpenFile(filepath.Join(h.StateDir, "node.lock"), os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true, err
	}
	return false, unix.Flock(int(f.Fd()), unix.LOCK_UN)
}
