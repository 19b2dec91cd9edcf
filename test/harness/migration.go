package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/routing"
)

// Command is one run of a galactic-cni node subcommand.
type Command struct {
	Code           int
	Stdout, Stderr string
	// Took is how long the process ran.
	Took time.Duration
}

func (c Command) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", c.Code, strings.TrimSpace(c.Stdout), strings.TrimSpace(c.Stderr))
}

// GalacticCNI runs `galactic-cni <verb> args...` inside the node as a
// runtime on it would: the node's settings, no CNI_ variables. The error
// is for the process failing to run at all.
func (n *Node) GalacticCNI(verb string, args ...string) (Command, error) {
	return n.GalacticCNIWith(nil, verb, args...)
}

// GalacticCNIWith is GalacticCNI with extraEnv added to the environment
// (another kubeconfig, say).
func (n *Node) GalacticCNIWith(extraEnv []string, verb string, args ...string) (Command, error) {
	argv := append([]string{"netns", "exec", n.Netns.Name, filepath.Join(n.env.BinDir, "galactic-cni"), verb}, args...)
	cmd := exec.Command("ip", argv...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CNI_") })
	cmd.Env = append(append(cmd.Env, n.Environ()...), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := Command{Stdout: stdout.String(), Stderr: stderr.String(), Took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		return r, fmt.Errorf("running galactic-cni %s: %w", verb, err)
	}
	return r, nil
}

// KernelRoute returns the node's route for p in the VPC's table; nil when
// there is none (or no domain).
func (n *Node) KernelRoute(vpc string, p netip.Prefix) (*netlink.Route, error) {
	var found *netlink.Route
	err := n.Do(func() error {
		d, err := routing.Find(vpc)
		if err != nil || d == nil {
			return err
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: d.Table}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for i, r := range routes {
			if r.Dst != nil && r.Dst.String() == p.String() {
				found = &routes[i]
			}
		}
		return nil
	})
	return found, err
}

// RouteChange is one change of a kernel route seen by a RouteWatch.
type RouteChange struct {
	At      time.Time
	Prefix  netip.Prefix
	Deleted bool
	// Via is the gateway; invalid for a route without one.
	Via       netip.Addr
	LinkIndex int
	// Protocol is the route's rtm_protocol (who installed it).
	Protocol int
}

func (c RouteChange) String() string {
	verb := "replaced"
	if c.Deleted {
		verb = "deleted"
	}
	return fmt.Sprintf("%s %s %s via %v dev %d proto %d", c.At.Format("15:04:05.000"), verb, c.Prefix, c.Via, c.LinkIndex, c.Protocol)
}

// RouteWatch records, with the time it saw each, every change of one
// prefix's routes (or of every route) in a node, from netlink's route
// notifications.
type RouteWatch struct {
	done chan struct{}
	mu   sync.Mutex
	seen []RouteChange
}

// WatchRoute starts recording changes of p's routes in the node until
// ctx ends.
func (n *Node) WatchRoute(ctx context.Context, p netip.Prefix) (*RouteWatch, error) {
	p = p.Masked()
	return n.watchRoutes(ctx, func(q netip.Prefix) bool { return q == p })
}

// WatchRoutes starts recording changes of every route in the node, in
// every table, until ctx ends.
func (n *Node) WatchRoutes(ctx context.Context) (*RouteWatch, error) {
	return n.watchRoutes(ctx, func(netip.Prefix) bool { return true })
}

func (n *Node) watchRoutes(ctx context.Context, match func(netip.Prefix) bool) (*RouteWatch, error) {
	w := &RouteWatch{done: make(chan struct{})}
	updates := make(chan netlink.RouteUpdate, 1024)
	var subErr error
	err := n.Do(func() error {
		subErr = netlink.RouteSubscribeWithOptions(updates, w.done, netlink.RouteSubscribeOptions{ListExisting: false})
		return subErr
	})
	if err != nil {
		return nil, err
	}
	go func() {
		<-ctx.Done()
		close(w.done)
	}()
	go func() {
		for u := range updates {
			if u.Dst == nil {
				continue
			}
			a, ok := netip.AddrFromSlice(u.Dst.IP)
			ones, _ := u.Dst.Mask.Size()
			dst := netip.PrefixFrom(a.Unmap(), ones).Masked()
			if !ok || !match(dst) {
				continue
			}
			c := RouteChange{At: time.Now(), Prefix: dst, Deleted: u.Type == unix.RTM_DELROUTE, LinkIndex: u.LinkIndex, Protocol: int(u.Protocol)}
			if a, ok := netip.AddrFromSlice(u.Gw); ok {
				c.Via = a.Unmap()
			}
			w.mu.Lock()
			w.seen = append(w.seen, c)
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// Changes are the changes seen so far.
func (w *RouteWatch) Changes() []RouteChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

// ChangesOf are the changes of p's routes seen so far.
func (w *RouteWatch) ChangesOf(p netip.Prefix) []RouteChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []RouteChange
	for _, c := range w.seen {
		if c.Prefix == p.Masked() {
			out = append(out, c)
		}
	}
	return out
}

// LeaseVersion is one version of a lease as a LeaseWatch saw it.
type LeaseVersion struct {
	At              time.Time
	ResourceVersion string
	Holder          string
	Token           int64
}

// LeaseWatch records every version of one lease.
type LeaseWatch struct {
	mu   sync.Mutex
	seen []LeaseVersion
	err  error
}

// WatchLease records every version of the lease called name from now on,
// until ctx ends.
func (e *Env) WatchLease(ctx context.Context, name string) (*LeaseWatch, error) {
	leases := e.API.Leases(Namespace)
	list, err := leases.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nil, err
	}
	w := &LeaseWatch{}
	for i := range list.Items {
		w.add(&list.Items[i])
	}
	wi, err := leases.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, err
	}
	go func() {
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok {
					w.add(l)
				}
			case watch.Error:
				w.mu.Lock()
				w.err = fmt.Errorf("lease watch: %v", ev.Object)
				w.mu.Unlock()
			}
		}
	}()
	return w, nil
}

func (w *LeaseWatch) add(l *coordinationv1.Lease) {
	r := handoff.RecordFromSpec(l.Spec)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, LeaseVersion{At: time.Now(), ResourceVersion: l.ResourceVersion, Holder: r.HolderIdentity, Token: int64(r.LeaseTransitions)})
}

// Versions are the versions seen so far, and the watch's error if it broke.
func (w *LeaseWatch) Versions() ([]LeaseVersion, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen), w.err
}

// OneHolder checks the fencing invariant over versions: the token never
// goes down, and the holder changes from one runtime to another only
// through a free lease or a higher token, never under one token.
func OneHolder(versions []LeaseVersion) error {
	for i := 1; i < len(versions); i++ {
		prev, cur := versions[i-1], versions[i]
		switch {
		case cur.Token < prev.Token:
			return fmt.Errorf("token went down from %d to %d (%s to %s)", prev.Token, cur.Token, prev.ResourceVersion, cur.ResourceVersion)
		case cur.Holder != "" && prev.Holder != "" && cur.Holder != prev.Holder && cur.Token == prev.Token:
			return fmt.Errorf("holder changed from %s to %s under token %d", prev.Holder, cur.Holder, cur.Token)
		}
	}
	return nil
}

// TapCounter counts the IPv4 packets the node sends out of one interface
// to one address: routed traffic towards a workload, not the kernel's own
// neighbour discovery.
type TapCounter struct {
	fd    int
	dst   netip.Addr
	count atomic.Int64
	stop  atomic.Bool
	done  chan struct{}
}

// CountSent starts counting the IPv4 packets to dst the node sends out
// of the interface called ifName.
func (n *Node) CountSent(ifName string, dst netip.Addr) (*TapCounter, error) {
	c := &TapCounter{fd: -1, dst: dst, done: make(chan struct{})}
	proto := int(htons(unix.ETH_P_IP))
	err := n.Do(func() error {
		l, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: l.Attrs().Index}); err != nil {
			unix.Close(fd)
			return err
		}
		// SOCK_DGRAM strips the link header: buffers start at the IP header.
		// A read timeout lets Stop end the reader.
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return err
		}
		c.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counting packets on %s: %w", ifName, err)
	}
	go c.read()
	return c, nil
}

func (c *TapCounter) read() {
	defer close(c.done)
	buf := make([]byte, 2048)
	for !c.stop.Load() {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype != unix.PACKET_OUTGOING || n < 20 {
			continue
		}
		if dst, ok := netip.AddrFromSlice(buf[16:20]); ok && dst == c.dst {
			c.count.Add(1)
		}
	}
}

// Count is the number of packets counted so far.
func (c *TapCounter) Count() int64 { return c.count.Load() }

// Stop ends the count and returns it.
func (c *TapCounter) Stop() int64 {
	if c.stop.CompareAndSwap(false, true) {
		<-c.done
		unix.Close(c.fd)
	}
	return c.count.Load()
}
