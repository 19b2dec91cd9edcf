// Command demo runs `make demo`: a VM in a VPC attached, upgraded, moved,
// crashed, its router restarted and drained across three nodes on one
// machine, with a client pinging it throughout; then two tenants' VPC blue
// of the same names and addresses, each reaching only its own. Ctrl-C
// stops it and removes everything it created.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/galactic-cni/galactic/test/demo"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

func main() {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (network namespaces, taps, policy routing, qemu on a tap): run `sudo make demo`")
		os.Exit(1)
	}
	if err := prerequisites(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	ctx, stop, out := harness.SignalContext()
	_, err := demo.Run(ctx, out, nil)
	// The demo removes what it made; anything still there is its bug, and
	// goes now.
	if left := harness.RemoveLeftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "demo: left behind, now removed: %s\n", strings.Join(left, ", "))
		if err == nil {
			err = errors.New("the demo left things behind")
		}
	}
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "demo: interrupted; what it had created is removed")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
	stop()
}

// prerequisites says exactly what the demo lacks: FRR as the route
// reflector and qemu for the VM. `make demo` installs them first
// (hack/install-deps.sh, as for `make test`).
func prerequisites() error {
	var missing []string
	for _, need := range []struct{ path, pkg string }{
		{harness.FRRBgpd, "frr"}, {"vtysh", "frr"}, {vm.QEMUBinary, "qemu-system-x86"},
	} {
		if _, err := exec.LookPath(need.path); err != nil && !slices.Contains(missing, need.pkg) {
			missing = append(missing, need.pkg)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("needs the Debian packages %s (FRR's bgpd and vtysh as the route reflector, qemu-system-x86_64 for the VM): run `make demo`, which installs them with hack/install-deps.sh, or install them by hand",
			strings.Join(missing, " and "))
	}
	return nil
}
