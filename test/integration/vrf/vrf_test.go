// Package vrf covers galactic-cni's `routing: vrf` on a real kernel with
// VRF: it boots a Debian kernel under qemu (KVM) and runs the scenarios of
// ./guest inside it, with the real galactic-cni and cnitool.
package vrf

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

const guestPkg = "./test/integration/vrf/guest"

// modules the scenarios need when the kernel has them as modules;
// nf_tables carries galactic's packet filter, and its libcrc32c needs the
// crc32c algorithm, a soft dependency modinfo does not list as one.
var modules = []string{"vrf", "tun", "veth", "vxlan", "nf_tables", "sch_ingress", "cls_bpf", "crc32c_generic"}

func TestVRFRoutingWorksOnARealKernelWithVRF(t *testing.T) {
	harness.RequireRoot(t)
	if _, err := vm.QEMU(); err != nil {
		t.Skipf("the VRF tests boot a VM: %v", err)
	}
	kernel, err := vm.EnsureKernel(modules, os.Stderr)
	if errors.Is(err, vm.ErrNoKernelSource) {
		t.Skipf("the VRF tests boot a Debian kernel: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := vm.EnsureBusybox(os.Stderr)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	start := time.Now()
	if err := vm.BuildStatic(dir, "./plugins/galactic-cni", "github.com/containernetworking/cni/cnitool"); err != nil {
		t.Fatal(err)
	}
	guest := filepath.Join(dir, "guest.test")
	if err := vm.BuildTestBinary(guest, guestPkg); err != nil {
		t.Fatal(err)
	}
	scenarios := listTests(t, guest)

	img := vm.Image{
		Kernel:  kernel,
		Busybox: busybox,
		Modules: modules,
		Files: []vm.File{
			{Path: "/opt/cni/bin/galactic-cni", Source: filepath.Join(dir, "galactic-cni")},
			{Path: "/bin/cnitool", Source: filepath.Join(dir, "cnitool")},
			{Path: "/bin/guest.test", Source: guest},
		},
		Env: []string{"GALACTIC_VM_GUEST=1", "CNI_PATH=/opt/cni/bin"},
		// The guest's own timeout comes first, so a hang ends with a stack dump.
		Command: "/bin/guest.test -test.v -test.timeout 90s",
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := img.Write(initrd); err != nil {
		t.Fatal(err)
	}

	t.Logf("built the static binaries and the initramfs in %s", time.Since(start).Round(100*time.Millisecond))

	accel, why := vm.Accelerator()
	opts := vm.BootOptions{Kernel: kernel.Image, Initrd: initrd, Accel: accel, Timeout: 150 * time.Second}
	if os.Getenv("GALACTIC_VM_CONSOLE") != "" {
		opts.Console = os.Stderr
	}
	res, err := vm.Boot(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s (%s) with %s (%s): the VM ran for %s", res.Release, kernel.Package, accel, why, res.Duration.Round(100*time.Millisecond))
	outcomes := res.GoTests()
	for _, name := range scenarios {
		t.Run(name, func(t *testing.T) {
			switch got := outcomes[name]; got {
			case "PASS":
			case "":
				t.Errorf("did not run in the VM")
			default:
				// A skip counts as a failure: the VM exists to run these.
				t.Errorf("%s in the VM", got)
			}
		})
	}
	if err := res.Err(); err != nil {
		t.Error(err)
	}
	if t.Failed() {
		t.Logf("VM console:\n%s", res.Log)
	}
}

// listTests asks the guest test binary for its top-level tests.
func listTests(t *testing.T, bin string) []string {
	t.Helper()
	cmd := exec.Command(bin, "-test.list", ".")
	cmd.Env = append(os.Environ(), "GALACTIC_VM_GUEST=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("listing the guest's tests: %v", err)
	}
	var names []string
	for _, l := range strings.Fields(string(out)) {
		if strings.HasPrefix(l, "Test") {
			names = append(names, l)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		t.Fatal("the guest test binary lists no tests")
	}
	return names
}
