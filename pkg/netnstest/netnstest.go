// Package netnstest runs unit tests that touch the kernel inside a
// network namespace of their own.
package netnstest

import (
	"os"
	"runtime"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// Run runs f in a fresh network namespace, on the test's own goroutine so
// that t.Fatal in f works; it skips without root.
func Run(t testing.TB, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		_ = testutils.UnmountNS(n)
	})
	// The deferred calls put the thread back before it is unlocked.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if err := n.Set(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := host.Set(); err != nil {
			panic(err) // the thread is in the wrong netns: nothing after this can be trusted
		}
	}()
	f()
}
