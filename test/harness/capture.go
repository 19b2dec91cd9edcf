package harness

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// frameKey is where a capture saw a frame: interface and direction.
type frameKey struct {
	ifindex  int
	outgoing bool
}

// Capture counts the frames carrying any of its markers that a namespace's
// interfaces receive or send, by marker and interface. It sees every frame
// before the packet filter does, so it tells where a packet went, not only
// where it was delivered.
type Capture struct {
	ns      *Netns
	fd      int
	markers [][]byte
	mu      sync.Mutex
	counts  map[int]map[frameKey]int // marker index -> where -> frames
	// sources are the IP sources of the frames, by marker, for messages.
	sources map[int]map[int]map[string]bool
	// reads counts the reader's empty polls; Settle waits for one more.
	polls int
	cond  *sync.Cond
	stop  chan struct{}
	done  chan struct{}
}

// Capture starts counting the frames with any of markers in the namespace;
// t's cleanup stops it.
func (n *Netns) Capture(markers ...[]byte) (*Capture, error) {
	c := &Capture{ns: n, fd: -1, markers: markers, counts: map[int]map[frameKey]int{}, sources: map[int]map[int]map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	err := n.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		c.fd = fd
		// A short receive timeout lets the reader notice Close and count
		// the moments its queue is empty.
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50000})
	})
	if err != nil {
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		return nil, err
	}
	go c.read()
	return c, nil
}

func (c *Capture) read() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				c.mu.Lock()
				c.polls++
				c.cond.Broadcast()
				c.mu.Unlock()
			}
			continue
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok {
			continue
		}
		for i, m := range c.markers {
			if bytes.Contains(buf[:n], m) {
				c.mu.Lock()
				if c.counts[i] == nil {
					c.counts[i] = map[frameKey]int{}
				}
				c.counts[i][frameKey{ll.Ifindex, ll.Pkttype == unix.PACKET_OUTGOING}]++
				if c.sources[i] == nil {
					c.sources[i] = map[int]map[string]bool{}
				}
				if c.sources[i][ll.Ifindex] == nil {
					c.sources[i][ll.Ifindex] = map[string]bool{}
				}
				c.sources[i][ll.Ifindex][ipSource(buf[:n])] = true
				c.mu.Unlock()
			}
		}
	}
}

// Settle waits until the reader has found its queue empty after the call:
// every frame the kernel had queued for it by then is counted.
func (c *Capture) Settle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := c.polls
	for c.polls < start+2 {
		c.cond.Wait()
	}
}

// Frames returns, after Settle, the frames of marker i by interface name,
// leaving out the interfaces named in except.
func (c *Capture) Frames(i int, except ...string) map[string]int {
	c.Settle()
	names := c.ifNames()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, n := range c.counts[i] {
		name, ok := names[k.ifindex]
		if !ok {
			name = fmt.Sprintf("ifindex %d", k.ifindex)
		}
		skip := false
		for _, e := range except {
			skip = skip || e == name
		}
		if !skip {
			out[name] += n
		}
	}
	return out
}

// Received is, after Settle, the frames of marker i that arrived on ifName.
func (c *Capture) Received(i int, ifName string) int {
	c.Settle()
	names := c.ifNames()
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for k, n := range c.counts[i] {
		if !k.outgoing && names[k.ifindex] == ifName {
			total += n
		}
	}
	return total
}

// Count is the total of Frames.
func (c *Capture) Count(i int, except ...string) int {
	total := 0
	for _, n := range c.Frames(i, except...) {
		total += n
	}
	return total
}

// Describe is Frames as text, for failure messages.
func (c *Capture) Describe(i int, except ...string) string {
	f := c.Frames(i, except...)
	var parts []string
	for name, n := range f {
		parts = append(parts, fmt.Sprintf("%s: %d", name, n))
	}
	sort.Strings(parts)
	names := c.ifNames()
	c.mu.Lock()
	var srcs []string
	for idx, ss := range c.sources[i] {
		if _, counted := f[names[idx]]; !counted {
			continue
		}
		for s := range ss {
			srcs = append(srcs, s)
		}
	}
	c.mu.Unlock()
	sort.Strings(srcs)
	return c.ns.Name + " {" + strings.Join(parts, ", ") + "} from " + strings.Join(srcs, " ")
}

// Sources are, after Settle, the IP sources of the frames of marker i seen
// on ifName.
func (c *Capture) Sources(i int, ifName string) []string {
	c.Settle()
	names := c.ifNames()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for idx, ss := range c.sources[i] {
		if names[idx] == ifName {
			for s := range ss {
				out = append(out, s)
			}
		}
	}
	sort.Strings(out)
	return out
}

// ipSource is the source address of an Ethernet frame's IP packet, "?"
// for anything else.
func ipSource(f []byte) string {
	if len(f) < 14 {
		return "?"
	}
	p := f[14:]
	switch {
	case f[12] == 0x08 && f[13] == 0x00 && len(p) >= 20:
		a, _ := netip.AddrFromSlice(p[12:16])
		return a.String()
	case f[12] == 0x86 && f[13] == 0xdd && len(p) >= 40:
		a, _ := netip.AddrFromSlice(p[8:24])
		return a.String()
	}
	return "?"
}

func (c *Capture) ifNames() map[int]string {
	names := map[int]string{}
	_ = c.ns.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		return err
	})
	return names
}

// Close stops the capture.
func (c *Capture) Close() {
	select {
	case <-c.stop:
		return
	default:
	}
	close(c.stop)
	<-c.done
	unix.Close(c.fd)
}

// WaitFrames polls until marker i has been seen on at least one frame
// outside except, or deadline passes.
func (c *Capture) WaitFrames(i int, deadline time.Time, except ...string) error {
	for {
		if c.Count(i, except...) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no frame with marker %d by the deadline: %s", i, c.Describe(i))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SendFrames sends Ethernet frames out of the namespace's interface ifName
// through a packet socket, as a workload that writes its own headers does.
func (n *Netns) SendFrames(ifName string, frames ...[]byte) error {
	return n.Do(func() error {
		l, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		for _, f := range frames {
			copy(to.Addr[:], f[:6])
			if err := unix.Sendto(fd, f, 0, to); err != nil {
				return fmt.Errorf("sending a frame on %s: %w", ifName, err)
			}
		}
		return nil
	})
}

// LinkMAC is the MAC of the namespace's interface ifName.
func (n *Netns) LinkMAC(ifName string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := n.Do(func() error {
		l, err := netlink.LinkByName(ifName)
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	})
	return mac, err
}

// OpenTap attaches to the namespace's tap ifName as a VMM does: a write
// to the file is a frame the guest sends, a read one it receives.
func (n *Netns) OpenTap(ifName string) (*os.File, error) {
	var f *os.File
	err := n.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(ifName)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("attaching to tap %s: %w", ifName, err)
		}
		f = os.NewFile(uintptr(fd), "/dev/net/tun:"+ifName)
		return nil
	})
	return f, err
}
