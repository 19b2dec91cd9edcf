package isolation

import (
	"context"
	"encoding/hex"
	"os"
	"slices"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/packet"
	"github.com/galactic-cni/galactic/test/vm"
)

// bootGuest adds a tap attachment and boots a qemu guest on it, skipping
// when qemu guests cannot run here.
func bootGuest(t *testing.T, env *harness.Env, n *harness.Node, a harness.Attachment) *vm.Guest {
	t.Helper()
	if err := vm.Available(); err != nil {
		t.Skipf("a qemu guest: %v", err)
	}
	assets, err := vm.EnsureGuestAssets(t.TempDir(), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	env.ForgetAttachment(t, a.VPC, a.Name)
	n.WriteConflist(t, a.Conflist())
	c := harness.NewContainer(t)
	cni := harness.LibCNI{Node: n, Network: a.Network()}
	r, err := cni.Add(context.Background(), harness.RuntimeConf(c, "net0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cni.Del(context.Background(), harness.RuntimeConf(c, "net0")) })
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	o := vm.GuestOptions{Netns: n.Netns.Name}
	if err := o.FromResult(res); err != nil {
		t.Fatal(err)
	}
	g, took, err := assets.Boot(context.Background(), o, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Kill)
	t.Logf("guest (qemu pid %d, %s) ready %s after qemu started", g.Pid, g.Accel, took.Round(time.Millisecond))
	return g
}

func tag() string { return hex.EncodeToString(packet.NewMarker()) }

func TestAQEMUGuestOnATapSendsOnlyAsItself(t *testing.T) {
	harness.RequireRoot(t)
	env := harness.Setup(t)
	n := plainNode(t, env, "node-a")
	blue2 := add(t, env, n, harness.Attachment{VPC: "blue", Name: "web-2", Addresses: []string{"10.20.0.6/24", "fd20::6/64"}, NoBGP: true})
	red1 := add(t, env, n, harness.Attachment{VPC: "red", Name: "db-1", Addresses: []string{"10.30.0.5/24", "fd30::5/64"}, NoBGP: true})
	guest := harness.Attachment{VPC: "blue", Name: "vm-1", Mode: names.ModeTap, Addresses: []string{"10.20.0.8/24", "fd20::8/64"}, NoBGP: true}
	g := bootGuest(t, env, n, guest)

	spoof, own := tag(), tag()
	r := capture(t, [][]byte{[]byte(spoof), []byte(own)}, blue2.c, red1.c, n.Netns)
	r.exclude(2, guest.HostIf())
	send := func(src, dst, tag string) {
		t.Helper()
		if err := g.Send(addr(src), addr(dst), dport, tag, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// The guest resolves its gateways first with its own addresses: a
	// neighbour solicitation from a spoofed source would be dropped too,
	// and the spoofed datagrams would never leave the guest.
	send("10.20.0.8", "10.20.0.6", tag())
	send("fd20::8", "fd20::6", tag())
	for _, src := range []string{"10.20.0.7", "10.30.0.5", "192.0.2.1", "198.51.100.7"} {
		send(src, "10.20.0.6", spoof)
	}
	for _, src := range []string{"fd20::7", "fd30::5", "2001:db8:ffff::7"} {
		send(src, "fd20::6", spoof)
	}
	send("10.20.0.6", "10.30.0.5", spoof)
	send("10.20.0.8", "10.20.0.6", own)
	send("fd20::8", "fd20::6", own)
	if err := r.caps[0].WaitFrames(1, time.Now().Add(20*time.Second)); err != nil {
		t.Fatalf("the guest's own datagrams should reach blue-2: %v\n%s", err, g.Status(10*time.Second))
	}
	if n := r.caps[0].Received(1, ifName); n < 2 {
		// Both families: tftp may retry, so at least one each.
		t.Errorf("blue-2 received %d of the guest's own datagrams, want IPv4 and IPv6", n)
	}
	// The guest did send them: the node saw them arrive on the tap.
	got := r.caps[2].Sources(0, guest.HostIf())
	for _, want := range []string{"10.20.0.6", "10.20.0.7", "10.30.0.5", "192.0.2.1", "198.51.100.7", "fd20::7", "fd30::5", "2001:db8:ffff::7"} {
		if !slices.Contains(got, want) {
			t.Errorf("the guest's datagram from %s never arrived on the tap (sources seen: %v)", want, got)
		}
	}
	r.none(t, 0, "datagrams a qemu guest sent from addresses it gave itself")
	if t.Failed() {
		t.Logf("guest console:\n%s", g.Console())
	}
}
