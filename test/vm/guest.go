package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/harness"
)

// Markers the network guest prints on the serial console.
const (
	MarkerReady = "GALACTIC-VM: READY"
	MarkerMTU   = "GALACTIC-VM: MTU "
	// MarkerUptime is the guest kernel's uptime as it says ready.
	MarkerUptime = "GALACTIC-VM: UPTIME "
	// MarkerStatusEnd ends what the guest prints for "status".
	MarkerStatusEnd = "GALACTIC-VM: END OF STATUS"
	// MarkerSent and the tag follow a "send".
	MarkerSent = "GALACTIC-VM: SENT "
)

// GuestModules are what the network guest loads: the virtio NIC qemu gives
// it and everything the driver depends on.
var GuestModules = []string{"virtio_pci", "virtio_net"}

// EchoPort is the TCP port the guest's echo service listens on, v4 and v6.
const EchoPort = 7

// guestScript configures the NIC from the kernel command line, starts the
// echo service, says ready and waits on the console for "poweroff".
//
// IPv4 keeps the subnet's prefix: the tap answers ARP for the VPC's other
// addresses (proxy ARP). IPv6 takes the address as a /128 and routes
// everything via the gateway, since the host does not proxy neighbour
// discovery; that is the route the CNI result gives.
var guestScript = `#!/bin/sh
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	galactic.addrs=*) addrs=$(echo "${arg#*=}" | tr , ' ') ;;
	galactic.gateways=*) gateways=$(echo "${arg#*=}" | tr , ' ') ;;
	esac
done
dev=eth0
i=0
while [ ! -e /sys/class/net/$dev ]; do
	i=$((i+1))
	[ $i -gt 200 ] && { echo "no $dev"; exit 3; }
	sleep 0.05
done
echo 0 > /proc/sys/net/ipv6/conf/$dev/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/$dev/accept_ra
ip link set lo up
ip link set $dev up || exit 4
for a in $addrs; do
	case "$a" in
	*:*) ip -6 addr add "${a%/*}/128" dev $dev || exit 5 ;;
	*) ip addr add "$a" dev $dev || exit 5 ;;
	esac
done
for g in $gateways; do
	case "$g" in
	*:*) gw6=$g; ip -6 route add "$g" dev $dev && ip -6 route add default via "$g" dev $dev || exit 6 ;;
	*) gw4=$g; ip route add default via "$g" dev $dev || exit 6 ;;
	esac
done
nc -ll -p ` + strconv.Itoa(EchoPort) + ` -e cat &
echo "` + MarkerMTU + `$(cat /sys/class/net/$dev/mtu)"
echo "` + MarkerUptime + `$(cut -d' ' -f1 /proc/uptime)"
echo "` + MarkerReady + `"
while read -r cmd; do
	c=$(echo "$cmd" | tr -d '\r')
	case "$c" in
	poweroff) break ;;
	status) ip addr; ip route; ip -6 route; ip neigh; echo "` + MarkerStatusEnd + `" ;;
	uptime) echo "` + MarkerUptime + `$(cut -d' ' -f1 /proc/uptime)" ;;
	send\ *)
		# send SOURCE DESTINATION PORT TAG: a UDP datagram (a TFTP read
		# request for the file TAG) from any source, as a tenant that
		# gives itself another address sends it.
		set -- $c
		fam=-4; len=32; gw=$gw4
		case "$2" in *:*) fam=-6; len=128; gw=$gw6 ;; esac
		added=
		if ! ip $fam addr show dev $dev | grep -q " $2/"; then
			ip $fam addr add "$2/$len" dev $dev && added=1
		fi
		ip $fam route replace "$3" via "$gw" dev $dev src "$2"
		timeout 1 tftp -g -r "$5" -l /dev/null "$3" "$4" 2>/dev/null
		ip $fam route del "$3" dev $dev
		[ -n "$added" ] && ip $fam addr del "$2/$len" dev $dev
		echo "` + MarkerSent + `$5" ;;
	esac
done
kill $! 2>/dev/null
ip link set $dev down
sync
`

// GuestImage writes the network guest's initramfs to p: busybox, the
// virtio NIC's modules and the script above as the command of /init.
func GuestImage(kernel *Kernel, busybox, p string) error {
	im := Image{
		Kernel:  kernel,
		Busybox: busybox,
		Modules: GuestModules,
		Files:   []File{{Path: "/bin/galactic-guest", Data: []byte(guestScript)}},
		Command: "/bin/galactic-guest",
	}
	return im.Write(p)
}

// GuestAssets are the kernel and initramfs every network guest boots.
type GuestAssets struct {
	Kernel *Kernel
	Initrd string
}

// EnsureGuestAssets fetches the kernel (cached) and writes the guest's
// initramfs into dir. ErrNoKernelSource means the host cannot have one.
func EnsureGuestAssets(dir string, progress io.Writer) (*GuestAssets, error) {
	kernel, err := EnsureKernel(GuestModules, progress)
	if err != nil {
		return nil, err
	}
	busybox, err := EnsureBusybox(progress)
	if err != nil {
		return nil, err
	}
	initrd := filepath.Join(dir, "guest-initrd.cpio")
	if err := GuestImage(kernel, busybox, initrd); err != nil {
		return nil, err
	}
	return &GuestAssets{Kernel: kernel, Initrd: initrd}, nil
}

// GuestOptions say where a guest runs and what it is told.
type GuestOptions struct {
	// Netns is the name of the network namespace (`ip netns`) holding Tap.
	Netns string
	// Tap is the existing tap qemu opens by name.
	Tap string
	// MTU is given to the guest's NIC (virtio host_mtu); 0 leaves qemu's.
	MTU int
	// Addresses are the attachment's, Gateways those galactic-cni returned.
	Addresses []netip.Prefix
	Gateways  []netip.Addr
	// Accel is AccelKVM or AccelTCG; empty picks with Accelerator.
	Accel string
	// MemoryMB defaults to 256.
	MemoryMB int
	// Console, when set, also gets the serial console as it arrives.
	Console io.Writer
	// QMP, when set, is the path of a QMP socket qemu listens on.
	QMP string
	// Incoming, when set, starts qemu waiting for a migration from
	// another qemu at this address ("tcp:<ip>:<port>"), paused after it
	// arrives until QMP's cont: the target of a live migration.
	Incoming string
}

// FromResult fills Tap, Addresses and Gateways from galactic-cni's ADD
// result: the tap it made and the addresses with their gateways.
func (o *GuestOptions) FromResult(res *current.Result) error {
	if len(res.Interfaces) == 0 {
		return fmt.Errorf("the ADD result names no tap: %+v", res)
	}
	o.Tap = res.Interfaces[0].Name
	for _, ip := range res.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		bits, _ := ip.Address.Mask.Size()
		gw, _ := netip.AddrFromSlice(ip.Gateway)
		o.Addresses = append(o.Addresses, netip.PrefixFrom(a.Unmap(), bits))
		o.Gateways = append(o.Gateways, gw.Unmap())
	}
	return nil
}

// QEMUArgs is the qemu command line of a guest on a galactic tap: the tap
// is opened by name with no helper scripts, so qemu changes nothing on
// the host.
func QEMUArgs(a *GuestAssets, o GuestOptions) []string {
	var addrs, gws []string
	for _, p := range o.Addresses {
		addrs = append(addrs, p.String())
	}
	for _, g := range o.Gateways {
		gws = append(gws, g.String())
	}
	nic := "virtio-net-pci,netdev=net0"
	if o.MTU > 0 {
		nic += ",host_mtu=" + strconv.Itoa(o.MTU)
	}
	mem := o.MemoryMB
	if mem == 0 {
		mem = 256
	}
	args := []string{
		"-accel", o.Accel, "-m", strconv.Itoa(mem), "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", a.Kernel.Image, "-initrd", a.Initrd,
		"-append", "console=ttyS0 panic=-1 quiet galactic.addrs=" + strings.Join(addrs, ",") + " galactic.gateways=" + strings.Join(gws, ","),
		"-netdev", "tap,id=net0,ifname=" + o.Tap + ",script=no,downscript=no",
		"-device", nic,
	}
	if o.QMP != "" {
		args = append(args, "-qmp", "unix:"+o.QMP+",server=on,wait=off")
	}
	if o.Incoming != "" {
		// The same machine on the same command line, waiting for its state.
		args = append(args, "-S", "-incoming", o.Incoming)
	}
	return args
}

// Guest is a running qemu attached to a tap.
type Guest struct {
	// Pid is qemu's (ip netns exec runs it in its own process).
	Pid   int
	Accel string
	// Started is when qemu was started; Ready when the guest said so.
	Started time.Time
	Ready   time.Time

	proc    *harness.Process
	stdin   io.WriteCloser
	console *syncBuffer
	stderr  *syncBuffer
	once    sync.Once
}

// StartGuest starts qemu in the namespace, attached to the tap; it returns
// once qemu runs. WaitReady waits for the guest.
func StartGuest(a *GuestAssets, o GuestOptions) (*Guest, error) {
	qemu, err := QEMU()
	if err != nil {
		return nil, err
	}
	if o.Accel == "" {
		o.Accel, _ = Accelerator()
	}
	args := append([]string{"netns", "exec", o.Netns, qemu}, QEMUArgs(a, o)...)
	cmd := exec.Command("ip", args...)
	g := &Guest{Accel: o.Accel, console: &syncBuffer{}, stderr: &syncBuffer{}}
	cmd.Stdout = io.Writer(g.console)
	if o.Console != nil {
		cmd.Stdout = io.MultiWriter(g.console, o.Console)
	}
	cmd.Stderr = g.stderr
	if g.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	g.Started = time.Now()
	// A Ctrl-C meant for the test leaves the guest to the test's cleanup,
	// and the guest ends with the test however the test ends.
	if g.proc, err = harness.StartProcess(QEMUBinary, cmd, ""); err != nil {
		g.stdin.Close()
		return nil, err
	}
	g.Pid = g.proc.Pid()
	return g, nil
}

// Console is the serial console so far, without carriage returns.
func (g *Guest) Console() string { return strings.ReplaceAll(g.console.String(), "\r", "") }

// Stderr is what qemu wrote on its standard error.
func (g *Guest) Stderr() string { return g.stderr.String() }

// Exited reports whether qemu has exited.
func (g *Guest) Exited() bool { return !g.proc.Running() }

// WaitReady waits until the guest reports ready, qemu exits or timeout
// passes, and returns the time from qemu's start to ready.
func (g *Guest) WaitReady(timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		if strings.Contains(g.console.String(), MarkerReady) {
			if g.Ready.IsZero() {
				g.Ready = time.Now()
			}
			return g.Ready.Sub(g.Started), nil
		}
		if g.Exited() {
			return 0, fmt.Errorf("qemu exited before the guest was ready (%v): %s", g.proc.Err(), strings.TrimSpace(g.stderr.String()))
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the guest was not ready within %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// MTU is the MTU the guest reported for its NIC; 0 before it did.
func (g *Guest) MTU() int {
	for _, line := range strings.Split(g.Console(), "\n") {
		if _, v, ok := strings.Cut(line, MarkerMTU); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// Status asks the guest for its addresses, routes and neighbours and
// returns them, for a failure message; it waits at most timeout.
func (g *Guest) Status(timeout time.Duration) string {
	from := len(g.Console())
	if g.Exited() {
		return "(qemu has exited)"
	}
	if _, err := io.WriteString(g.stdin, "status\n"); err != nil {
		return err.Error()
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && !g.Exited() {
		if out := g.Console()[from:]; strings.Contains(out, MarkerStatusEnd) {
			return out
		}
		time.Sleep(20 * time.Millisecond)
	}
	return g.Console()[from:] + "\n(no end of status)"
}

// UptimeNow asks the guest on its console for its kernel's uptime and
// waits at most timeout for the answer: across a live migration it keeps
// growing, after a reboot it starts again.
func (g *Guest) UptimeNow(timeout time.Duration) (time.Duration, error) {
	from := len(g.Console())
	if _, err := io.WriteString(g.stdin, "uptime\n"); err != nil {
		return 0, fmt.Errorf("writing to the guest's console: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && !g.Exited() {
		lines := strings.Split(g.Console()[from:], "\n")
		// The last piece is a line still being written.
		for _, line := range lines[:len(lines)-1] {
			if _, v, ok := strings.Cut(line, MarkerUptime); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					return time.Duration(f * float64(time.Second)), nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("the guest did not say its uptime within %s", timeout)
}

// Uptime is how long the guest's kernel had run when it said ready: the
// part of a boot after qemu and the firmware have loaded the kernel. 0
// before it said so.
func (g *Guest) Uptime() time.Duration {
	for _, line := range strings.Split(g.Console(), "\n") {
		if _, v, ok := strings.Cut(line, MarkerUptime); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return time.Duration(f * float64(time.Second))
			}
		}
	}
	return 0
}

// Send has the guest send a UDP datagram carrying tag (ASCII, no spaces)
// from src to dst:port, src being any address the guest gives itself for
// the moment, and returns once it has.
func (g *Guest) Send(src, dst netip.Addr, port int, tag string, timeout time.Duration) error {
	from := len(g.Console())
	if _, err := fmt.Fprintf(g.stdin, "send %s %s %d %s\n", src, dst, port, tag); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for !g.Exited() {
		if strings.Contains(g.Console()[from:], MarkerSent+tag) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the guest did not send %s from %s to %s: %s", tag, src, dst, g.Console()[from:])
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("qemu has exited")
}

// Poweroff asks the guest on its console to power off and waits until
// qemu has exited: the guest brings its NIC down and powers the machine
// off, and qemu closes the tap.
func (g *Guest) Poweroff(timeout time.Duration) error {
	if g.Exited() {
		return errors.New("qemu has already exited")
	}
	if _, err := io.WriteString(g.stdin, "poweroff\n"); err != nil {
		return fmt.Errorf("writing to the guest's console: %w", err)
	}
	select {
	case <-g.proc.Done():
	case <-time.After(timeout):
		g.Kill()
		return fmt.Errorf("the guest did not power off within %s; killed qemu", timeout)
	}
	if err := g.proc.Err(); err != nil {
		return fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(g.stderr.String()))
	}
	if !strings.Contains(g.Console(), MarkerExit+"0") {
		return errors.New("qemu exited without the guest's clean exit on the console")
	}
	return nil
}

// Kill ends qemu with SIGKILL, as a crash would, and waits until it is
// gone. Killing a guest that has exited does nothing.
func (g *Guest) Kill() {
	g.once.Do(func() {
		g.proc.Kill()
		g.stdin.Close()
	})
}

// Boot starts a guest and waits until it is ready; on failure it kills
// qemu and the error carries the console.
func (a *GuestAssets) Boot(ctx context.Context, o GuestOptions, timeout time.Duration) (*Guest, time.Duration, error) {
	g, err := StartGuest(a, o)
	if err != nil {
		return nil, 0, err
	}
	stop := context.AfterFunc(ctx, g.Kill)
	defer stop()
	took, err := g.WaitReady(timeout)
	if err != nil {
		g.Kill()
		return nil, 0, fmt.Errorf("%w\nconsole:\n%s", err, g.Console())
	}
	return g, took, nil
}

// Available says why qemu guests cannot run here, nil when they can.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("qemu on a tap needs root")
	}
	if _, err := QEMU(); err != nil {
		return err
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("no /dev/net/tun: %w", err)
	}
	return nil
}
