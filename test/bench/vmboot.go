package bench

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/vm"
)

// VMBootResult is the VM boot section for one accelerator: how long a real guest
// takes to answer on its tap, next to the chain ADD that made the tap.
type VMBootResult struct {
	Accel, Why string
	// Kernel is the guest's kernel release.
	Kernel string
	// Add is the chain's ADD through cnitool; Ready is qemu's start to the
	// guest's ready line on the console; Ping is qemu's start to the first
	// echo reply the node gets from the guest's IPv4 address; Kernel is
	// the guest kernel's uptime as it said ready.
	Add, Ready, Ping, KernelUp Sample
	Skipped                    string
}

// vmPingInterval is how often the node pings a booting guest.
const vmPingInterval = 20 * time.Millisecond

// vmBoot boots a few guests on a galactic tap for each accelerator that
// can run here: the chain's ADD, then qemu, timed to the guest's first
// ping reply.
func (b *bench) vmBoot() error {
	skip := func(why string) error {
		b.res.VMs = append(b.res.VMs, &VMBootResult{Accel: vm.AccelTCG, Skipped: why})
		b.say("VM boot: skipped: %s", why)
		return nil
	}
	if err := vm.Available(); err != nil {
		return skip(err.Error())
	}
	assets, err := vm.EnsureGuestAssets(b.dir, b.out)
	if err != nil {
		return skip("no guest kernel: " + err.Error())
	}
	n, err := b.newNode("vm")
	if err != nil {
		return err
	}
	const network = "bench-vm"
	if err := n.WriteConflistFile(galacticConf(network, "vmb", "vm-0", false, true)); err != nil {
		return err
	}
	accels := []struct{ accel, why string }{{vm.AccelTCG, "qemu's emulator, usable everywhere"}}
	kvmErr := vm.KVM()
	if kvmErr == nil {
		accels = append(accels, struct{ accel, why string }{vm.AccelKVM, "/dev/kvm is usable"})
	}
	defer func() {
		if kvmErr != nil {
			b.res.VMs = append(b.res.VMs, &VMBootResult{Accel: vm.AccelKVM, Skipped: kvmErr.Error()})
		}
	}()
	for _, a := range accels {
		r := &VMBootResult{Accel: a.accel, Why: a.why, Kernel: assets.Kernel.Release}
		for range b.opts.VMBoots {
			if err := b.bootOnce(n, network, assets, r); err != nil {
				return fmt.Errorf("%s: %w", a.accel, err)
			}
		}
		b.res.VMs = append(b.res.VMs, r)
		b.say("VM boot (%s): ADD p50 %s, ready p50 %s, first ping p50 %s", a.accel, ms(r.Add.P50()), ms(r.Ready.P50()), ms(r.Ping.P50()))
	}
	return nil
}

func (b *bench) bootOnce(n *node, network string, assets *vm.GuestAssets, r *VMBootResult) error {
	c, err := b.container()
	if err != nil {
		return err
	}
	add, err := b.cnitool(n, "add", network, c, ifName)
	if err != nil {
		return err
	}
	defer b.cnitool(n, "del", network, c, ifName)
	res := &current.Result{}
	if err := json.Unmarshal(add.Stdout, res); err != nil || len(res.Interfaces) == 0 || len(res.IPs) == 0 {
		return fmt.Errorf("the ADD result names no tap or address (%v): %s", err, add.Stdout)
	}
	o := vm.GuestOptions{Netns: n.Netns.Name, MTU: benchMTU, Accel: r.Accel}
	if err := o.FromResult(res); err != nil {
		return err
	}
	g, err := vm.StartGuest(assets, o)
	if err != nil {
		return err
	}
	defer g.Kill()
	deadline := time.Now().Add(3 * time.Minute)
	if err := n.PingUntil(o.Addresses[0].Addr(), vmPingInterval, deadline); err != nil {
		return fmt.Errorf("%w\nconsole:\n%s", err, g.Console())
	}
	ping := time.Since(g.Started)
	ready, err := g.WaitReady(time.Until(deadline))
	if err != nil {
		return fmt.Errorf("%w\nconsole:\n%s", err, g.Console())
	}
	if err := g.Poweroff(time.Minute); err != nil {
		return err
	}
	r.Add = append(r.Add, add.Wall)
	r.Ready = append(r.Ready, ready)
	r.Ping = append(r.Ping, ping)
	r.KernelUp = append(r.KernelUp, g.Uptime())
	return nil
}

func renderVMs(w *strings.Builder, r *Results) {
	if len(r.VMs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	sectionHead(w, r, "vm-boot")
	p("")
	p("What share of an instance's start is galactic's: the chain's ADD (galactic-cni in tap mode and galactic-bgp, handoff off, through cnitool, as in %s), then a real VMM on the tap it made. qemu (`%s`) runs in the node namespace with `-netdev tap,ifname=<tap>,script=no,downscript=no` and a virtio-net device (see [the VMM guide](install/vmm.md)); the guest is the Debian kernel with a busybox init (test/vm) that takes the attachment's addresses and the ADD result's gateways from the kernel command line, starts an echo service and prints a ready line on the serial console. The node pings the guest's IPv4 address every %s from the moment qemu starts; *first ping* is qemu's start to the first reply, *ready* to the console line, and *guest kernel* the guest's uptime as it said ready (the rest of *ready* is qemu and the firmware starting and loading the kernel and initramfs). %d boots per accelerator, each a new ADD, guest, poweroff and DEL; 256 MiB, one vCPU.", r.sec("chain-latency"), vm.QEMUBinary, vmPingInterval, r.Options.VMBoots)
	p("")
	p("| accelerator | guest kernel | ADD p50 | ready p50 | of it, guest kernel p50 | first ping p50 | first ping max | ADD share of ADD + first ping |")
	p("|---|---|---|---|---|---|---|---|")
	for _, v := range r.VMs {
		if v.Skipped != "" {
			p("| %s | not measured: %s | | | | | | |", v.Accel, v.Skipped)
			continue
		}
		add, ping := v.Add.P50(), v.Ping.P50()
		p("| %s (%s) | %s | %s | %s | %s | %s | %s | %.1f%% |", v.Accel, v.Why, v.Kernel, ms(add), ms(v.Ready.P50()), ms(v.KernelUp.P50()), ms(ping), ms(v.Ping.Quantile(1)), 100*float64(add)/float64(add+ping))
	}
	p("")
	for _, v := range r.VMs {
		if v.Skipped == "" {
			p("With %s, of the %s from the start of ADD to the guest's first answer, galactic's ADD is %s; the guest's kernel runs for %s of the rest, and qemu with the firmware takes the remainder before the kernel starts.", v.Accel, ms(v.Add.P50()+v.Ping.P50()), ms(v.Add.P50()), ms(v.KernelUp.P50()))
			p("")
		}
	}
}
