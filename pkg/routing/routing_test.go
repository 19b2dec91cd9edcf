package routing

import (
	"net/netip"
	"strings"
	"testing"
)

func TestAllocateSkipsUsedTablesAndStaysInItsRange(t *testing.T) {
	first, err := Allocate("blue", nil)
	if err != nil {
		t.Fatal(err)
	}
	if first < TableMin || first >= TableMin+TableCount {
		t.Fatalf("table %d is outside %d..%d", first, TableMin, TableMin+TableCount-1)
	}
	again, _ := Allocate("blue", map[int]bool{})
	if again != first {
		t.Fatalf("the same VPC should start at the same table: %d then %d", first, again)
	}
	next, err := Allocate("blue", map[int]bool{first: true})
	if err != nil || next == first {
		t.Fatalf("a used table must be skipped: got %d (%v)", next, err)
	}
	last := TableMin + TableCount - 1
	used := map[int]bool{}
	for tb := TableMin; tb < last; tb++ {
		used[tb] = true
	}
	if got, err := Allocate("blue", used); err != nil || got != last {
		t.Fatalf("the search should wrap around to the one free table %d: got %d (%v)", last, got, err)
	}
	used[last] = true
	if _, err := Allocate("blue", used); err == nil || !strings.Contains(err.Error(), "no free routing table") {
		t.Fatalf("a full range should be an error, got %v", err)
	}
}

func TestTwoVPCsNeverGetTheSameTable(t *testing.T) {
	used := map[int]bool{}
	for _, vpc := range []string{"blue", "red", "green", "a", "b"} {
		tb, err := Allocate(vpc, used)
		if err != nil {
			t.Fatal(err)
		}
		if used[tb] {
			t.Fatalf("VPC %s got table %d, which another VPC has", vpc, tb)
		}
		used[tb] = true
	}
}

func TestTheMarkerLiesInTheDiscardPrefixAndDiffersPerVPC(t *testing.T) {
	discard := netip.MustParsePrefix("100::/64")
	blue, red := Marker("blue"), Marker("red")
	if !discard.Contains(blue.Addr()) || blue.Bits() != 128 {
		t.Fatalf("marker %s should be a /128 in %s", blue, discard)
	}
	if blue == red || Marker("blue") != blue {
		t.Fatalf("markers should be stable and per VPC: %s %s", blue, red)
	}
}

func TestTheVRFDeviceNameFitsAnInterfaceName(t *testing.T) {
	name := DeviceName("a-very-long-vpc-name-that-is-still-a-valid-dns-label-0123456789")
	if len(name) > 15 || !strings.HasPrefix(name, "gr") {
		t.Fatalf("device name %q must be gr+hash within 15 characters", name)
	}
	if DeviceName("blue") == DeviceName("red") {
		t.Fatal("VPCs must get different VRF devices")
	}
	if DeviceAlias("blue") != "galactic-vpc:blue" {
		t.Fatalf("alias %q", DeviceAlias("blue"))
	}
}

func TestTheVRFMarkerDiffersFromTheTableMarkerSoAVRFWithoutItsDeviceIsStillKnown(t *testing.T) {
	discard := netip.MustParsePrefix("100::/64")
	for _, vpc := range []string{"blue", "red"} {
		v := VRFMarker(vpc)
		if !discard.Contains(v.Addr()) || v.Bits() != 128 {
			t.Fatalf("VRF marker %s should be a /128 in %s", v, discard)
		}
		if v == Marker(vpc) {
			t.Fatalf("VPC %s: the VRF and table markers must differ, both are %s", vpc, v)
		}
	}
	if VRFMarker("blue") == VRFMarker("red") {
		t.Fatal("VRF markers should differ per VPC")
	}
}
