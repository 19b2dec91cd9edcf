package demo

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
	"github.com/galactic-cni/galactic/test/vm"
)

// liveVM is the guest the live-migration step moves while it runs,
// announced always, so that it is routed without an availability report.
var (
	liveVM = harness.Attachment{VPC: "blue", Name: "live-0-net0", Mode: "tap", VNI: vniBlue, Addresses: []string{"10.20.0.9/24"},
		Handoff: withHandoff, MTU: mtu, PodAnnotations: true}
	liveAddr = netip.MustParseAddr("10.20.0.9")
)

// LiveMigration is what the live-migration step measured.
type LiveMigration struct {
	// Blackout is the longest time between two answered pings; Lost the
	// unanswered requests of the step.
	Blackout   time.Duration
	Sent, Lost int
	// QEMUDowntime is qemu's own measure of the guest's pause; Galactic
	// is from the source's release returning to node-c's route changing.
	QEMUDowntime, Galactic time.Duration
	RouteChanges           int
	// UptimeBefore and UptimeAfter are the guest's uptime on node-a before
	// and on node-b after; TCPSurvived says the connection echoed after.
	UptimeBefore, UptimeAfter time.Duration
	TCPSurvived               bool
	// Steps are the driver's timings.
	Steps migration.Timings
}

func (l LiveMigration) summary() string {
	return fmt.Sprintf("%d ms blackout (qemu's pause %d ms, galactic's part %d ms), %d of %d replies lost; node-c's route changed %d times; uptime %.1fs -> %.1fs; TCP connection survived: %v",
		l.Blackout.Milliseconds(), l.QEMUDowntime.Milliseconds(), l.Galactic.Milliseconds(), l.Lost, l.Sent, l.RouteChanges,
		l.UptimeBefore.Seconds(), l.UptimeAfter.Seconds(), l.TCPSurvived)
}

// 0. A second VM live-migrates from node-a to node-b while the client
// pings it every 10 ms and holds a TCP connection to its echo service:
// the reference sequence of test/migration, with qemu on both sides.
func (d *demo) liveMigration() error {
	d.say("== 0. a running VM live-migrates from node-a to node-b (qemu -incoming, migrate over the fabric)")
	for _, n := range d.nodes {
		if err := n.WriteConflistFile(liveVM.Conflist()); err != nil {
			return err
		}
	}
	src, err := d.container()
	if err != nil {
		return err
	}
	out, err := d.cnitool("node-a", "add", liveVM, src)
	if err != nil {
		return err
	}
	res := &current.Result{}
	if err := json.Unmarshal([]byte(out), res); err != nil {
		return fmt.Errorf("the ADD result: %v: %s", err, out)
	}
	o := vm.GuestOptions{Netns: d.nodes["node-a"].Netns.Name, Accel: d.qemu.accel, MTU: mtu, MemoryMB: 128, QMP: filepath.Join(d.dir, "a.qmp")}
	if err := o.FromResult(res); err != nil {
		return err
	}
	g, took, err := d.qemu.assets.Boot(d.ctx, o, 3*time.Minute)
	if err != nil {
		return err
	}
	d.undo = append(d.undo, g.Kill)
	d.say("node-a: the guest booted in %.1fs on tap %s, with a QMP socket", took.Seconds(), o.Tap)
	if err := d.until(routeLimit, "the client reaching "+liveAddr.String(), func() error { return d.clientNetns.Ping(liveAddr) }); err != nil {
		return err
	}
	var conn net.Conn
	if err := d.clientNetns.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(liveAddr.String(), strconv.Itoa(vm.EchoPort)), 5*time.Second)
		return err
	}); err != nil {
		return fmt.Errorf("a TCP connection to the guest's echo service: %w", err)
	}
	defer conn.Close()
	echo := lineEcho(conn)
	if err := echo("before the migration"); err != nil {
		return err
	}
	var rep LiveMigration
	if rep.UptimeBefore, err = g.UptimeNow(10 * time.Second); err != nil {
		return err
	}
	d.say("node-c: the client holds a TCP connection to %s:%d and pings it every %s", liveAddr, vm.EchoPort, pingInterval)
	routes, err := d.nodes["node-c"].WatchRoute(d.ctx, netip.PrefixFrom(liveAddr, 32))
	if err != nil {
		return err
	}
	pinger, err := d.clientNetns.StartPinger(liveAddr, pingInterval)
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	q := &migration.QEMU{
		Assets: d.qemu.assets, Accel: d.qemu.accel, MTU: mtu, MemoryMB: o.MemoryMB, Source: g, SourceQMP: o.QMP,
		TargetNode: d.nodes["node-b"].Node, TargetAddr: d.nodes["node-b"].underlay, Port: 4444, TargetQMP: filepath.Join(d.dir, "b.qmp"),
	}
	d.undo = append(d.undo, q.StopTarget)
	tgt, err := d.container()
	if err != nil {
		return err
	}
	m := &migration.Migration{
		VPC: liveVM.VPC, Attachment: liveVM.Name, Network: liveVM.Network(), IfName: ifName,
		Source: migration.Side{Node: d.nodes["node-a"].Node, Container: src},
		Target: migration.Side{Node: d.nodes["node-b"].Node, Container: tgt},
		VMM:    q,
	}
	d.say("the runtime's steps: standby ADD on node-b, qemu -incoming on its tap, migrate, release on node-a, promote on node-b, resume, DEL on node-a")
	mr, err := m.Run(d.ctx)
	if err != nil {
		return err
	}
	rep.Steps, rep.QEMUDowntime = mr.Timings, mr.Timings.QEMUDowntime
	t := mr.Timings
	d.say("standby ADD %d ms, migrate %d ms, release %d ms, promote %d ms, resume %d ms, source DEL %d ms",
		t.Standby.Sub(t.Start).Milliseconds(), t.Migrated.Sub(t.Standby).Milliseconds(), t.Released.Sub(t.Migrated).Milliseconds(),
		t.Promoted.Sub(t.Released).Milliseconds(), t.Resumed.Sub(t.Promoted).Milliseconds(), t.SourceDeleted.Sub(t.Resumed).Milliseconds())
	if err := d.until(routeLimit, "the guest answering on node-b", func() error { return d.clientNetns.Ping(liveAddr) }); err != nil {
		return err
	}
	rep.TCPSurvived = echo("after the migration") == nil
	if rep.UptimeAfter, err = q.Target.UptimeNow(10 * time.Second); err != nil {
		return err
	}
	settle()
	st := pinger.Stop()
	rep.Blackout, rep.Sent, rep.Lost = st.LongestGap, st.Sent, st.Lost
	ch := routes.Changes()
	rep.RouteChanges = len(ch)
	for _, c := range ch {
		if c.At.After(t.Released) {
			rep.Galactic = c.At.Sub(t.Released)
			break
		}
	}
	d.report.Live = rep
	d.say("migrated: %s", rep.summary())
	lease, err := d.env.API.Leases(harness.Namespace).Get(d.ctx, names.Lease(liveVM.VPC, liveVM.Name), metav1.GetOptions{})
	if err != nil {
		return err
	}
	d.say("the lease: %s, token %d", harness.LeaseHolder(lease), harness.LeaseToken(lease))
	errs := []error{
		expect(rep.RouteChanges == 1 && ch[0].Via == d.nodes["node-b"].underlay, "node-c's route to change once, to node-b: %v", ch),
		expect(rep.TCPSurvived, "the TCP connection to echo after the migration"),
		expect(rep.UptimeAfter > rep.UptimeBefore, "the guest's uptime to go on (%s, then %s)", rep.UptimeBefore, rep.UptimeAfter),
		expect(harness.LeaseHolder(lease) == names.Holder("node-b", harness.ContainerID(tgt.Path)), "node-b's container to hold the lease"),
	}
	// The step leaves nothing behind: the guest powers off and its DEL runs.
	if err := q.Target.Poweroff(time.Minute); err != nil {
		errs = append(errs, err)
	}
	if _, err := d.cnitool("node-b", "del", liveVM, tgt); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// lineEcho sends a line on conn and checks that it comes back.
func lineEcho(conn net.Conn) func(string) error {
	r := bufio.NewReader(conn)
	return func(s string) error {
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := fmt.Fprintln(conn, s); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if got != s+"\n" {
			return fmt.Errorf("echoed %q, sent %q", got, s)
		}
		return nil
	}
}
