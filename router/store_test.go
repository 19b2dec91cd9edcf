package router

import (
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/speaker"
)

func TestSavedStateReadsBackAsWritten(t *testing.T) {
	s := NewStore(t.TempDir())
	rd := speaker.RD{Admin: underlay, Assigned: 2}
	v := Saved{
		RDs:  map[string]uint16{"blue": 1, "red": 2},
		VNIs: map[string]uint32{"blue": 10100, "red": 10200},
		Paths: []SavedPath{
			savedPath(want("red", "fd20::5/128", 10200, 4, true)),
			savedPath(want("red", "10.30.0.5/32", 10200, 4, false)),
			savedPath(want("blue", "10.20.0.5/32", 10100, 0, false)),
		},
	}
	if err := s.Save(v); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Load()
	if err != nil || !ok {
		t.Fatalf("Load: ok %v, %v", ok, err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("got  %+v\nwant %+v", got, v)
	}
	// Save orders the paths by RD then prefix, so equal state is equal bytes.
	if got.Paths[0].RD.Assigned != 1 || got.Paths[1].RD != rd || got.Paths[1].Prefix != "10.30.0.5/32" {
		t.Errorf("paths not in RD, prefix order: %+v", got.Paths)
	}
	if fi, err := os.Stat(s.Path); err != nil || fi.Mode().Perm() != 0o600 || s.Path != filepath.Join(filepath.Dir(filepath.Dir(s.Path)), "router", "state.json") {
		t.Errorf("state file %s: %v %v", s.Path, fi, err)
	}
}

func TestASavedPathAnnouncesTheSameRoute(t *testing.T) {
	for _, r := range []speaker.Route{want("blue", "10.20.0.5/32", 10100, 3, false), want("red", "fd20::/64", 10200, 0, true)} {
		back, err := savedPath(r).route()
		if err != nil || !back.Equal(r) {
			t.Errorf("route %+v came back as %+v (%v)", r, back, err)
		}
	}
	for _, bad := range []SavedPath{
		{Prefix: "x", NextHop: "192.0.2.11", RouterMAC: "02:00:00:00:00:01"},
		{Prefix: "10.20.0.5/32", NextHop: "x", RouterMAC: "02:00:00:00:00:01"},
		{Prefix: "10.20.0.5/32", NextHop: "192.0.2.11", RouterMAC: ""},
	} {
		if _, err := bad.route(); err == nil {
			t.Errorf("%+v gave a route", bad)
		}
	}
}

func TestAMissingStateFileIsAFirstStart(t *testing.T) {
	s := NewStore(t.TempDir())
	v, ok, err := s.Load()
	if err != nil || ok {
		t.Fatalf("ok %v, err %v: want a first start", ok, err)
	}
	// The maps are ready for AllocateRD and ResolveVNIs.
	if v.RDs == nil || v.VNIs == nil || len(v.RDs)+len(v.VNIs)+len(v.Paths) != 0 {
		t.Fatalf("state %+v, want empty maps", v)
	}
}

func TestAStateFileWithoutMapsLoadsWithEmptyOnes(t *testing.T) {
	s := NewStore(t.TempDir())
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path, []byte(`{"rds":null}`), 0o600); err != nil {
		t.Fatal(err)
	}
	v, ok, err := s.Load()
	if err != nil || !ok || v.RDs == nil || v.VNIs == nil {
		t.Fatalf("state %+v, ok %v, err %v", v, ok, err)
	}
}

func TestACorruptStateFileIsAnErrorNamingIt(t *testing.T) {
	s := NewStore(t.TempDir())
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path, []byte(`{"rds":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Load(); err == nil || ok || !strings.Contains(err.Error(), s.Path) {
		t.Fatalf("ok %v, err %v", ok, err)
	}
}

func TestForgetRemovesTheStateAndMayBeRepeated(t *testing.T) {
	s := NewStore(t.TempDir())
	if err := s.Save(Saved{RDs: map[string]uint16{"blue": 1}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Forget(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := s.Load(); ok || err != nil {
		t.Fatalf("after Forget: ok %v, err %v", ok, err)
	}
}

func TestAllocateRDKeepsNumbersAndHandsOutTheLowestFree(t *testing.T) {
	cases := []struct {
		name string
		rds  map[string]uint16
		vpc  string
		want uint16
	}{
		{"the first VPC gets 1", map[string]uint16{}, "blue", 1},
		{"a VPC keeps its number", map[string]uint16{"blue": 7}, "blue", 7},
		{"the lowest free number", map[string]uint16{"blue": 1, "red": 3}, "green", 2},
		{"after the used ones", map[string]uint16{"blue": 1, "red": 2}, "green", 3},
		{"a gap at the start", map[string]uint16{"red": 2}, "green", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := maps.Clone(tc.rds)
			n, err := AllocateRD(tc.rds, tc.vpc)
			if err != nil || n != tc.want {
				t.Fatalf("AllocateRD = %d, %v; want %d", n, err, tc.want)
			}
			before[tc.vpc] = tc.want
			if !maps.Equal(tc.rds, before) {
				t.Errorf("map %v, want %v", tc.rds, before)
			}
		})
	}
}

func TestAllocateRDFailsWhenEveryNumberIsTaken(t *testing.T) {
	rds := map[string]uint16{}
	for n := 1; n <= 65535; n++ {
		rds["vpc-"+strconv.Itoa(n)] = uint16(n)
	}
	if n, err := AllocateRD(rds, "one-too-many"); err == nil {
		t.Fatalf("got %d", n)
	}
	if _, ok := rds["one-too-many"]; ok {
		t.Fatal("a failed allocation was recorded")
	}
}

func TestOnlyARestartOfTheSameBootAndIdentityReplaysTheSavedPaths(t *testing.T) {
	saved := Saved{RDs: map[string]uint16{"blue": 1}, VNIs: map[string]uint32{"blue": 10100},
		Paths: []SavedPath{{VPC: "blue", Prefix: "10.20.0.5/32"}}, BootID: "boot-1", Identity: "id-1"}
	cases := []struct {
		name       string
		ok         bool
		boot, id   string
		restarting bool
	}{
		{"the same boot and identity", true, "boot-1", "id-1", true},
		{"a reboot", true, "boot-2", "id-1", false},
		{"a changed identity", true, "boot-1", "id-2", false},
		{"an unknown boot ID", true, "", "id-1", false},
		{"no saved state", false, "boot-1", "id-1", false},
	}
	for _, tc := range cases {
		out, restarting, why := Resume(saved, tc.ok, tc.boot, tc.id)
		if restarting != tc.restarting {
			t.Errorf("%s: restarting %v, want %v (%s)", tc.name, restarting, tc.restarting, why)
		}
		if tc.ok && !restarting && (len(out.Paths) != 0 || why == "") {
			t.Errorf("%s: paths %v kept, reason %q", tc.name, out.Paths, why)
		}
		if tc.ok && (out.RDs["blue"] != 1 || out.VNIs["blue"] != 10100) {
			t.Errorf("%s: RDs %v and VNIs %v must stay", tc.name, out.RDs, out.VNIs)
		}
	}
}

func TestTheIdentityChangesWithEachPartOfIt(t *testing.T) {
	base := config.Config{ASN: 65010, RouterID: netip.MustParseAddr("192.0.2.11"), Underlay: netip.MustParseAddr("192.0.2.11"), RouteTargetASN: 65000}
	for name, f := range map[string]func(c *config.Config){
		"routerID": func(c *config.Config) { c.RouterID = netip.MustParseAddr("192.0.2.99") },
		"underlay": func(c *config.Config) { c.Underlay = netip.MustParseAddr("192.0.2.99") },
		"asn":      func(c *config.Config) { c.ASN++ },
		"rtASN":    func(c *config.Config) { c.RouteTargetASN++ },
	} {
		c := base
		f(&c)
		if Identity(&c) == Identity(&base) {
			t.Errorf("a changed %s keeps the identity", name)
		}
	}
}
