package bench

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/galactic-cni/galactic/pkg/filter"
	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/vishvananda/netlink"
)

// ForwardRow is one forwarding measurement: a UDP stream between two
// workloads on different nodes (through both nodes' filters and VXLAN),
// with the filter on both nodes and without it, at Residents attachments
// on each node's filter. Each figure is the median over the rounds.
type ForwardRow struct {
	Residents int
	// Payload is the UDP payload size: large for throughput, small for
	// packets per second.
	Payload int
	// Delivered packets per second, with and without the filter.
	With, Without float64
	// Ratio is the median of each round's with/without: the two of a
	// round run back to back, so a change in the machine's load between
	// rounds falls on both.
	Ratio float64
}

const (
	forwardVPC = "fwd"
	// forwardGoal is the filter's target: with it at least 95% of the
	// same path without it.
	forwardGoal = 0.95
)

var (
	forwardResidents = []int{10, 1000}
	forwardPayloads  = []int{1400, 64}
)

// forwardNode is one node of the forwarding bench and what its filter
// holds besides its records: the resident stand-ins and the peer VTEP.
type forwardNode struct {
	*routedNode
	residents []filter.Attachment
	peer      netip.Addr
}

// setResidents makes the node's filter hold its records' attachments
// and n stand-ins, as galactic-gc's pass would with that many workloads.
func (fn *forwardNode) setResidents(n int) error {
	fn.residents = nil
	for i := range n {
		fn.residents = append(fn.residents, filter.Attachment{
			Interface: fmt.Sprintf("gt%013x", i),
			Sources: []netip.Prefix{
				netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 22, byte(i >> 8), byte(i)}), 32),
				netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x22, 14: byte(i >> 8), 15: byte(i)}), 128),
			},
			Gateways: []netip.Addr{netip.MustParseAddr("10.22.0.1"), netip.MustParseAddr("fd22::1")},
		})
	}
	return fn.filterOn()
}

// filterOn restores the node's filter: tables, its records' elements, the
// stand-ins and the peer's VTEP.
func (fn *forwardNode) filterOn() error {
	recs, err := state.NewStore(fn.Settings.StateDir).List()
	if err != nil {
		return err
	}
	atts := slices.Clone(fn.residents)
	for _, r := range recs {
		atts = append(atts, hostif.RecordFilter(r))
	}
	return fn.Do(func() error {
		if _, err := filter.New().Sync(atts); err != nil {
			return err
		}
		_, err := filter.New().SetVTEPs([]netip.Addr{fn.peer})
		return err
	})
}

func (fn *forwardNode) filterOff() error { return fn.Do(filter.New().Delete) }

// forwarding runs the forwarding half of the "tenant isolation" section.
func (b *bench) forwarding() error {
	if _, err := os.Stat(harness.FRRBgpd); err != nil {
		b.say("forwarding: skipped: FRR is not installed")
		return nil
	}
	f, err := harness.CreateFabric(harness.FabricOptions{})
	if err != nil {
		return err
	}
	b.undo = append(b.undo, f.Close)
	var nodes []*forwardNode
	for _, name := range []string{"fa", "fc"} {
		rn, err := b.fabricNode(f, name, true)
		if err != nil {
			return err
		}
		nodes = append(nodes, &forwardNode{routedNode: rn})
	}
	nodes[0].peer, nodes[1].peer = nodes[1].underlay, nodes[0].underlay
	src, err := b.attach(nodes[0].routedNode, routedConf(forwardVPC, "src", "veth", []string{"10.20.6.5/16"}, false, ""))
	if err != nil {
		return err
	}
	dst, err := b.attach(nodes[1].routedNode, routedConf(forwardVPC, "dst", "veth", []string{"10.20.6.7/16"}, false, ""))
	if err != nil {
		return err
	}
	to := netip.MustParseAddr("10.20.6.7")
	if err := src.PingUntil(to, 100*time.Millisecond, time.Now().Add(time.Minute)); err != nil {
		return fmt.Errorf("the source does not reach the sink: %w", err)
	}
	// The routes and VXLAN entries stay in the kernels; the routers would
	// restore the filter tables (empty) while they are meant to be gone.
	for _, fn := range nodes {
		fn.router.Kill()
	}
	// Many short alternating rounds: the machine's load moves the rate by
	// more than the filter does, and a median of many pairs evens it out;
	// shorter rounds pair the two halves closer in time.
	rounds, window := 41, 500*time.Millisecond
	if b.opts.Quick {
		rounds = 7
	}
	b.res.Isolation.ForwardRounds = rounds
	b.res.Isolation.ForwardWindow = window
	// A first stream warms the path (neighbour entries, caches, the
	// sink's socket) and is not counted.
	if _, err := udpStream(src, dst, to, forwardPayloads[0], window); err != nil {
		return err
	}
	for _, residents := range forwardResidents {
		for _, fn := range nodes {
			if err := fn.setResidents(residents); err != nil {
				return err
			}
		}
		for _, payload := range forwardPayloads {
			var with, without, ratios []float64
			for round := range rounds {
				// Alternate which goes first, so a trend in the machine's
				// load falls on both alike.
				for _, on := range []bool{round%2 == 0, round%2 != 0} {
					for _, fn := range nodes {
						toggle := fn.filterOff
						if on {
							toggle = fn.filterOn
						}
						if err := toggle(); err != nil {
							return err
						}
					}
					if err := src.PingUntil(to, 100*time.Millisecond, time.Now().Add(30*time.Second)); err != nil {
						return fmt.Errorf("the path with the filter %v: %w", on, err)
					}
					pps, err := udpStream(src, dst, to, payload, window)
					if err != nil {
						return err
					}
					if on {
						with = append(with, pps)
					} else {
						without = append(without, pps)
					}
				}
				ratios = append(ratios, with[round]/without[round])
			}
			row := ForwardRow{Residents: residents, Payload: payload, With: median(with), Without: median(without), Ratio: median(ratios)}
			b.res.Isolation.Forwarding = append(b.res.Isolation.Forwarding, row)
			b.say("forwarding at %d attachments, %d-byte payloads: %s with the filter, %s without (%.0f%%)",
				residents, payload, row.describe(row.With), row.describe(row.Without), 100*row.Ratio)
		}
	}
	// Leave the nodes filtered, as they were made.
	for _, fn := range nodes {
		if err := fn.filterOn(); err != nil {
			return err
		}
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// ratio is the row's with/without: Ratio, or the medians' for results
// recorded without it.
func (r ForwardRow) ratio() float64 {
	if r.Ratio > 0 {
		return r.Ratio
	}
	return r.With / r.Without
}

// describe formats a packet rate with its throughput.
func (r ForwardRow) describe(pps float64) string {
	return fmt.Sprintf("%.0f pkt/s (%.0f Mbit/s)", pps, pps*float64(r.Payload)*8/1e6)
}

// udpStream sends payload-sized datagrams from the src container to the
// sink at addr for window as fast as one socket can, and returns how
// many per second arrived at the sink's interface. They are counted
// there, not at the sink's socket: what the socket takes depends on when
// its reader is scheduled on these two cores, which moved one-second
// rounds of the same path by a factor of up to 12 (0.16 to 1.93) where
// the interface's count moves them by 0.76 to 1.31.
func udpStream(src, dst *harness.Netns, addr netip.Addr, payload int, window time.Duration) (float64, error) {
	var rx *net.UDPConn
	if err := dst.Do(func() (err error) {
		rx, err = net.ListenUDP("udp", &net.UDPAddr{Port: 9})
		return err
	}); err != nil {
		return 0, err
	}
	defer rx.Close()
	var tx *net.UDPConn
	if err := src.Do(func() (err error) {
		tx, err = net.DialUDP("udp", nil, &net.UDPAddr{IP: addr.AsSlice(), Port: 9})
		return err
	}); err != nil {
		return 0, err
	}
	defer tx.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			if _, err := rx.Read(buf); err != nil {
				return
			}
		}
	}()
	before, err := rxPackets(dst)
	if err != nil {
		return 0, err
	}
	msg := make([]byte, payload)
	start := time.Now()
	for time.Since(start) < window {
		for range 64 {
			// A full queue refuses a datagram now and then: that is the
			// path's limit, not an error.
			if _, err := tx.Write(msg); err != nil && !errors.Is(err, net.ErrClosed) {
				continue
			}
		}
	}
	elapsed := time.Since(start)
	// What is still in flight arrives within a moment.
	time.Sleep(100 * time.Millisecond)
	after, err := rxPackets(dst)
	rx.Close()
	<-done
	if err != nil {
		return 0, err
	}
	return float64(after-before) / elapsed.Seconds(), nil
}

// rxPackets is the packets received on the namespace's interfaces other
// than loopback.
func rxPackets(ns *harness.Netns) (uint64, error) {
	var n uint64
	err := ns.Do(func() error {
		ls, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range ls {
			if a := l.Attrs(); a.Name != "lo" && a.Statistics != nil {
				n += a.Statistics.RxPackets
			}
		}
		return nil
	})
	return n, err
}
