// Command demo runs `make demo`: a VM in a VPC attached, upgraded, moved,
// crashed, its router restarted and drained across three nodes on one
// machine, with a client pinging it throughout. Ctrl-C stops it and removes
// everything it created.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := demo.Run(ctx, os.Stdout, nil); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "demo: interrupted; what it had created is removed")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

// prerequisites installs what the demo runs and the machine lacks (FRR as
// the route reflector, qemu for the VM) with apt-get, as .ci/run does for
// `make test`, or says exactly what is missing.
func prerequisites() error {
	var missing []string
	for _, need := range []struct{ path, pkg string }{
		{harness.FRRBgpd, "frr"}, {"vtysh", "frr"}, {vm.QEMUBinary, "qemu-system-x86"},
	} {
		if _, err := exec.LookPath(need.path); err == nil {
			continue
		}
		if len(missing) == 0 || missing[len(missing)-1] != need.pkg {
			missing = append(missing, need.pkg)
		}
	}
	_, aptErr := exec.LookPath("apt-get")
	// The guest's kernel comes from `apt-get download`, which needs package
	// lists even when nothing is to be installed.
	lists := exec.Command("apt-cache", "show", vm.KernelMetaPackage).Run() == nil
	if len(missing) == 0 && (lists || aptErr != nil) {
		return nil
	}
	if len(missing) == 0 {
		fmt.Println("demo: apt-get update, for the guest kernel's package (first run only)")
		return aptGet("update", "-q")
	}
	if aptErr != nil {
		return fmt.Errorf("needs %s (FRR's bgpd and vtysh as the route reflector, qemu-system-x86_64 for the VM) and there is no apt-get to install them: install them and run it again", strings.Join(missing, " and "))
	}
	fmt.Printf("demo: installing %s with apt-get (first run only)\n", strings.Join(missing, " "))
	if err := aptGet("update", "-q"); err != nil {
		return err
	}
	if err := aptGet(append([]string{"install", "-y", "-q", "--no-install-recommends"}, missing...)...); err != nil {
		return fmt.Errorf("%w: install %s and run it again", err, strings.Join(missing, " "))
	}
	return nil
}

func aptGet(args ...string) error {
	cmd := exec.Command("apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("apt-get %s: %w", args[0], err)
	}
	return nil
}
