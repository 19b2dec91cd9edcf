package router

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/pkg/netnstest"
	"github.com/galactic-cni/galactic/router/dataplane"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// A burst of route writes that overflows the watch's socket ends the
// kernel's subscription: the watch subscribes again, asks the next pass
// to read everything, and marks what others change from then on.
func TestTheRouteWatchComesBackAfterItsSocketOverflows(t *testing.T) {
	netnstest.Run(t, func() {
		d, err := New(Options{
			Config: testDaemonConfig(t), Node: "node-a", Namespace: "galactic", StateDir: t.TempDir(),
			Adverts: emptyAPI{}, Live: func(string) bool { return true },
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Resync: time.Hour,
		})
		if err != nil {
			t.Fatal(err)
		}
		d.watch.buffer = 2048 // the kernel's least: a few notifications
		here, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer here.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		defer func() { cancel(); <-done }()
		go func() {
			defer close(done)
			// The watch subscribes in this namespace; the thread is not
			// given back to others afterwards.
			runtime.LockOSThread()
			if err := netns.Set(here); err != nil {
				return
			}
			d.watch.run(ctx)
		}()
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Fatal(err)
		}
		const table = 1000 // the watch skips the main table and below
		route := func(i int, proto netlink.RouteProtocol) *netlink.Route {
			return &netlink.Route{LinkIndex: lo.Attrs().Index, Table: table, Protocol: proto,
				Dst: &net.IPNet{IP: net.IPv4(10, 30, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}}
		}
		until := func(what string, ok func() bool) {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: not within 10s", what)
				}
			}
		}
		// A foreign route that comes and goes.
		foreign := func() bool {
			_ = netlink.RouteAdd(route(0, netlink.RouteProtocol(4)))
			_ = netlink.RouteDel(route(0, netlink.RouteProtocol(4)))
			time.Sleep(time.Millisecond)
			return d.watch.marks.take().tables[table]
		}
		// The watch is up when a foreign route's change is marked.
		until("the first subscription", foreign)
		// The router's own writes: notifications the watch skips.
		for i := 1; i < 20000 && !d.watch.resyncNow.Load(); i++ {
			if err := netlink.RouteAdd(route(i, netlink.RouteProtocol(dataplane.Protocol))); err != nil {
				t.Fatal(err)
			}
		}
		if !d.watch.resyncNow.Load() {
			t.Fatal("20,000 route writes did not overflow a 2 KiB watch; nothing tested")
		}
		d.watch.marks.take()
		until("a foreign change marked after the overflow", foreign)
	})
}
