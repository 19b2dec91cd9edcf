package isolation

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/packet"
)

func TestMain(m *testing.M) { harness.Main(m) }

// ifName is the containers' interface (harness.Attachment's default).
const ifName = "net0"

// workload is an attachment added on a node, with its container.
type workload struct {
	harness.Attachment
	node *harness.Node
	c    *harness.Netns
	// hostMAC is the host interface's MAC, the destination of every frame
	// the workload sends; mac is the workload's own.
	hostMAC, mac net.HardwareAddr
	// tap is the VMM's end of a tap attachment.
	tap *os.File
}

func add(t *testing.T, env *harness.Env, n *harness.Node, a harness.Attachment) *workload {
	t.Helper()
	env.ForgetAttachment(t, a.VPC, a.Name)
	w := &workload{Attachment: a, node: n, c: harness.NewContainer(t)}
	n.AddIn(t, a, w.c)
	t.Cleanup(func() {
		n.WriteConflist(t, a.Conflist())
		_, _ = n.CNITool("del", a.Network(), w.c, ifName)
	})
	var err error
	if w.hostMAC, err = n.LinkMAC(a.HostIf()); err != nil {
		t.Fatal(err)
	}
	if a.Mode == names.ModeTap {
		if w.tap, err = n.OpenTap(a.HostIf()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.tap.Close() })
		w.mac = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	} else if w.mac, err = w.c.LinkMAC(ifName); err != nil {
		t.Fatal(err)
	}
	return w
}

// send sends IP packets from the workload as frames it wrote itself: out
// of the container's eth0, or into the tap as its guest.
func (w *workload) send(t *testing.T, packets ...[]byte) {
	t.Helper()
	w.sendFrom(t, w.mac, packets...)
}

func (w *workload) sendFrom(t *testing.T, mac net.HardwareAddr, packets ...[]byte) {
	t.Helper()
	var frames [][]byte
	for _, p := range packets {
		et := uint16(packet.EtherTypeIPv4)
		if p[0]>>4 == 6 {
			et = packet.EtherTypeIPv6
		}
		frames = append(frames, packet.Ethernet(w.hostMAC, mac, et, p))
	}
	w.sendFrames(t, frames...)
}

// sendFrames sends whole frames from the workload.
func (w *workload) sendFrames(t *testing.T, frames ...[]byte) {
	t.Helper()
	if w.tap != nil {
		for _, f := range frames {
			if _, err := w.tap.Write(f); err != nil {
				t.Fatalf("writing a frame into tap %s: %v", w.HostIf(), err)
			}
		}
		return
	}
	if err := w.c.SendFrames(ifName, frames...); err != nil {
		t.Fatal(err)
	}
}

// receivers captures the markers in every namespace given and checks
// counts with one message naming where frames were seen.
type receivers struct {
	caps []*harness.Capture
	// except are the interfaces of each capture whose frames do not count:
	// the sender's own.
	except  [][]string
	skipped []int
}

func capture(t *testing.T, markers [][]byte, nss ...*harness.Netns) *receivers {
	t.Helper()
	r := &receivers{}
	for _, n := range nss {
		c, err := n.Capture(markers...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		r.caps = append(r.caps, c)
		r.except = append(r.except, nil)
	}
	return r
}

// skip leaves the i-th namespace out: it is the sender.
func (r *receivers) skip(i int) { r.skipped = append(r.skipped, i) }

// exclude leaves the named interfaces of the i-th namespace out.
func (r *receivers) exclude(i int, ifNames ...string) { r.except[i] = append(r.except[i], ifNames...) }

// none fails t when any receiver saw marker m.
func (r *receivers) none(t *testing.T, m int, what string) {
	t.Helper()
	var seen []string
	for i, c := range r.caps {
		if slices.Contains(r.skipped, i) {
			continue
		}
		if c.Count(m, r.except[i]...) > 0 {
			seen = append(seen, c.Describe(m, r.except[i]...))
		}
	}
	if len(seen) > 0 {
		t.Errorf("%s: frames seen at %s", what, strings.Join(seen, "; "))
	}
}

func run(t *testing.T, n *harness.Netns, args ...string) string {
	t.Helper()
	out, err := n.Run(args[0], args[1:]...)
	if err != nil {
		t.Fatalf("%v in %s: %v %s", args, n.Name, err, out)
	}
	return out
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }
