package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

// EnvVMM, set to "tapholder", makes the demo use the stand-in VMM even
// where qemu can run.
const EnvVMM = "GALACTIC_DEMO_VMM"

// vmm starts the demo's VM on a node's tap.
type vmm interface {
	// describe says what the VM is, for the narration.
	describe() string
	// start attaches a new VM to the tap the ADD result names and returns
	// once it runs (a guest: once it is ready).
	start(ctx context.Context, n *harness.Node, res *current.Result) (instance, error)
}

// instance is one running VM.
type instance interface {
	pid() int
	// stop shuts it down in order; crash ends it at once, as a failing
	// node does. Both return once the tap is let go.
	stop() error
	crash()
	// note is what the narration says once it runs.
	note() string
}

// chooseVMM picks qemu where it can run, else the tapholder stand-in, and
// says why.
func chooseVMM(bin, dir string, progress io.Writer) (vmm, string) {
	if os.Getenv(EnvVMM) == "tapholder" {
		return tapholder{bin: bin}, EnvVMM + "=tapholder asks for it"
	}
	if err := vm.Available(); err != nil {
		return tapholder{bin: bin}, "qemu cannot run here: " + err.Error()
	}
	assets, err := vm.EnsureGuestAssets(dir, progress)
	if err != nil {
		return tapholder{bin: bin}, "there is no guest kernel: " + err.Error()
	}
	accel, why := vm.Accelerator()
	return qemu{assets: assets, accel: accel}, fmt.Sprintf("%s with %s (%s)", vm.QEMUBinary, accel, why)
}

// qemu boots a Debian kernel with a busybox init that takes the
// attachment's addresses and gateways from the kernel command line.
type qemu struct {
	assets *vm.GuestAssets
	accel  string
}

func (q qemu) describe() string {
	return "a qemu guest (virtio-net on the tap, kernel " + q.assets.Kernel.Release + ")"
}

func (q qemu) start(ctx context.Context, n *harness.Node, res *current.Result) (instance, error) {
	o := vm.GuestOptions{Netns: n.Netns.Name, Tap: res.Interfaces[0].Name, Accel: q.accel}
	if mtu, err := n.Run("cat", filepath.Join("/sys/class/net", o.Tap, "mtu")); err == nil {
		fmt.Sscan(mtu, &o.MTU)
	}
	for _, ip := range res.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		bits, _ := ip.Address.Mask.Size()
		gw, _ := netip.AddrFromSlice(ip.Gateway)
		o.Addresses = append(o.Addresses, netip.PrefixFrom(a.Unmap(), bits))
		o.Gateways = append(o.Gateways, gw.Unmap())
	}
	g, took, err := q.assets.Boot(ctx, o, 3*time.Minute)
	if err != nil {
		return nil, err
	}
	// The node reaches its workloads through the VPC's table: a reply
	// proves the guest took its addresses and routes through the tap.
	var answered []string
	for _, p := range o.Addresses {
		if err := n.Ping(p.Addr()); err != nil {
			g.Kill()
			return nil, fmt.Errorf("the guest does not answer ping on %s from the node: %w\nconsole:\n%s", p.Addr(), err, g.Console())
		}
		answered = append(answered, p.Addr().String())
	}
	return &guest{g: g, summary: fmt.Sprintf("booted in %.1fs (%s), MTU %d; answers ping on %s from the node",
		took.Seconds(), g.Accel, g.MTU(), strings.Join(answered, " and "))}, nil
}

type guest struct {
	g       *vm.Guest
	summary string
}

func (v *guest) pid() int { return v.g.Pid }

// stop powers the guest off from its console.
func (v *guest) stop() error { return v.g.Poweroff(time.Minute) }

func (v *guest) crash() { v.g.Kill() }

func (v *guest) note() string { return v.summary }

// tapholder is a process that only opens the tap, as a VMM does: the
// stand-in where qemu cannot run.
type tapholder struct{ bin string }

func (tapholder) describe() string {
	return "a stand-in VMM (test/bin/tapholder, a process that only opens the tap; no guest, no traffic)"
}

func (h tapholder) start(_ context.Context, n *harness.Node, res *current.Result) (instance, error) {
	cmd := exec.Command("ip", "netns", "exec", n.Netns.Name, filepath.Join(h.bin, "tapholder"), res.Interfaces[0].Name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &holderProc{cmd: cmd}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready") {
		p.crash()
		return nil, fmt.Errorf("tapholder did not attach to %s: %q %v", res.Interfaces[0].Name, line, err)
	}
	return p, nil
}

type holderProc struct {
	cmd  *exec.Cmd
	done bool
}

func (p *holderProc) pid() int { return p.cmd.Process.Pid }

// stop is the same as crash: tapholder has nothing to shut down.
func (p *holderProc) stop() error { p.crash(); return nil }

func (p *holderProc) crash() {
	if p.done {
		return
	}
	p.done = true
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	_ = p.cmd.Wait()
}

func (p *holderProc) note() string { return "holds the tap" }
