package speaker

import (
	"context"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/galactic-cni/galactic/router/config"
)

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func TestZZMem(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("ZZ_N"))
	if n == 0 {
		t.Skip()
	}
	ctx := context.Background()
	port := freePort(t, "127.0.0.2")
	h0 := heap()
	s := server.NewBgpServer()
	go s.Serve()
	defer s.Stop()
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: 65000, RouterId: "127.0.0.2",
		ListenPort: int32(port), ListenAddresses: []string{"127.0.0.2"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
		Conf:     &api.PeerConf{NeighborAddress: "127.0.0.1", PeerAsn: 65000},
		Timers:   &api.Timers{Config: &api.TimersConfig{ConnectRetry: 1, HoldTime: 90, KeepaliveInterval: 30}},
		AfiSafis: []*api.AfiSafi{{Config: &api.AfiSafiConfig{Family: evpnFamily, Enabled: true}}}, Transport: &api.Transport{PassiveMode: true},
	}}); err != nil {
		t.Fatal(err)
	}
	var paths []*apiutil.Path
	for i := 0; i < n; i++ {
		vni := uint32(1 + i/100)
		r := Route{RD: RD{Admin: netip.MustParseAddr("127.0.0.2"), Assigned: uint16(vni)}, Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32),
			VNI: vni, RTASN: 65000, NextHop: netip.MustParseAddr("127.0.0.2"), RouterMAC: net.HardwareAddr{2, 0, 0, 0, byte(vni >> 8), byte(vni)}, Generation: 1}
		p, _ := toPath(r)
		paths = append(paths, p)
	}
	if _, err := s.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
		t.Fatal(err)
	}
	paths = nil
	h1 := heap()
	var got atomic.Int64
	var rs [][]Received
	ch := make(chan []Received, 1024)
	done := make(chan struct{})
	go func() {
		for x := range ch {
			rs = append(rs, x)
		}
		close(done)
	}()
	cfg := &config.Config{ASN: 65000, RouterID: netip.MustParseAddr("127.0.0.1"), Underlay: netip.MustParseAddr("127.0.0.1"),
		ListenPort: -1, RouteTargetASN: 65000,
		Peers: []config.Peer{{Address: netip.MustParseAddr("127.0.0.2"), ASN: 65000, Port: uint16(port), Hold: 90 * time.Second, Keepalive: 30 * time.Second}}}
	var members []RouteTarget
	for v := 1; v <= 1+n/100; v++ {
		members = append(members, RouteTarget{65000, uint32(v)})
	}
	g, err := Start(ctx, Options{Config: cfg, Membership: members, OnEvent: func(ev Event) {
		if ev.Kind == EventPaths {
			got.Add(int64(len(ev.Paths)))
			ch <- ev.Paths
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop(ctx)
	t0 := time.Now()
	for got.Load() < int64(n) {
		time.Sleep(10 * time.Millisecond)
	}
	el := time.Since(t0)
	close(ch)
	<-done
	time.Sleep(time.Second)
	h2 := heap()
	var cnt int
	for _, x := range rs {
		cnt += len(x)
	}
	rs = nil
	h3 := heap()
	if f, err := os.Create("/tmp/zzheap.prof"); err == nil {
		pprof.WriteHeapProfile(f)
		f.Close()
	}
	t.Logf("n=%d in %s; upstream %d B/path; node incl. Received %d B/path; node GoBGP alone %d B/path (cnt %d)", n, el, (h1-h0)/uint64(n), (h2-h1)/uint64(n), (h3-h1)/uint64(n), cnt)
}
