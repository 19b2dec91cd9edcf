package migration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/migration"
	"github.com/galactic-cni/galactic/test/vm"
)

const (
	guestMTU = 1400
	// migrationPort is where the incoming qemu listens on its node's
	// fabric address.
	migrationPort = 4444
	bootGuard     = 3 * time.Minute
)

var (
	assetsOnce sync.Once
	assets     *vm.GuestAssets
	assetsErr  error
)

// guestAssets returns the guest's kernel and initramfs, or skips saying
// why qemu guests cannot run here.
func guestAssets(t *testing.T) *vm.GuestAssets {
	t.Helper()
	harness.RequireRoot(t)
	if err := vm.Available(); err != nil {
		t.Skipf("live migration runs qemu guests: %v", err)
	}
	assetsOnce.Do(func() {
		var dir string
		if dir, assetsErr = harness.SharedTempDir("galactic-migration-"); assetsErr == nil {
			assets, assetsErr = vm.EnsureGuestAssets(dir, os.Stderr)
		}
	})
	if errors.Is(assetsErr, vm.ErrNoKernelSource) {
		t.Skipf("live migration boots a Debian kernel: %v", assetsErr)
	}
	if assetsErr != nil {
		t.Fatal(assetsErr)
	}
	return assets
}

// shortDir is a directory for unix sockets, whose paths must stay short.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := harness.MkdirTemp("qmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { harness.RemoveDir(dir) })
	return dir
}

// live is a VM running on a galactic tap on the source node.
type live struct {
	vm   harness.Attachment
	src  *harness.Netns
	qemu *migration.QEMU
}

// bootVM ADDs vm's tap on a and boots the guest on it with a QMP socket.
func (cl *cluster) bootVM(t *testing.T, as *vm.GuestAssets, name string) *live {
	t.Helper()
	at := cl.vm(t, name)
	at.Mode = "tap"
	return cl.bootVMOf(t, as, at)
}

// bootVMOf is bootVM of the attachment at.
func (cl *cluster) bootVMOf(t *testing.T, as *vm.GuestAssets, at harness.Attachment) *live {
	t.Helper()
	cl.a.Install(t, at)
	src := harness.NewContainer(t)
	out, err := cl.a.CNITool("add", at.Network(), src, ifName)
	if err != nil {
		t.Fatalf("ADD on node-a: %v", err)
	}
	res := &current.Result{}
	if err := json.Unmarshal([]byte(out), res); err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	accel, _ := vm.Accelerator()
	o := vm.GuestOptions{Netns: cl.a.Netns.Name, Accel: accel, MTU: guestMTU, MemoryMB: 128, QMP: filepath.Join(dir, "a.qmp")}
	if err := o.FromResult(res); err != nil {
		t.Fatal(err)
	}
	g, took, err := as.Boot(context.Background(), o, bootGuard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Kill)
	t.Logf("guest booted on node-a in %s (%s)", took, accel)
	q := &migration.QEMU{
		Assets: as, Accel: accel, MTU: guestMTU, MemoryMB: o.MemoryMB, Source: g, SourceQMP: o.QMP,
		TargetNode: cl.b.Node, TargetAddr: cl.b.Underlay, Port: migrationPort, TargetQMP: filepath.Join(dir, "b.qmp"),
	}
	t.Cleanup(q.StopTarget)
	return &live{vm: at, src: src, qemu: q}
}

// running is a booted guest with a client on node-c holding a TCP
// connection to it, and the guest's uptime and lease token before the
// test migrates it.
type running struct {
	*live
	wc     *harness.Netns
	conn   *echo
	uptime time.Duration
	token  int64
}

func (cl *cluster) runningGuest(t *testing.T, as *vm.GuestAssets, name string) running {
	t.Helper()
	l := cl.bootVM(t, as, name)
	wc := cl.client(t, l.vm)
	conn := dialEcho(t, wc, l.vm)
	if err := conn.roundTrip(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	before, err := l.qemu.Source.UptimeNow(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return running{live: l, wc: wc, conn: conn, uptime: before, token: harness.LeaseToken(cl.env.Lease(t, l.vm.LeaseName()))}
}

// echo is a TCP connection from the client to the guest's echo service.
type echo struct {
	conn net.Conn
	r    *bufio.Reader
	n    int
}

func dialEcho(t *testing.T, from *harness.Netns, to harness.Attachment) *echo {
	t.Helper()
	var conn net.Conn
	harness.Eventually(t, hangGuard, "a TCP connection to the guest's echo service", func() error {
		return from.Do(func() (err error) {
			conn, err = net.DialTimeout("tcp", net.JoinHostPort(to.Addr(false).String(), strconv.Itoa(vm.EchoPort)), 2*time.Second)
			return err
		})
	})
	t.Cleanup(func() { conn.Close() })
	return &echo{conn: conn, r: bufio.NewReader(conn)}
}

// roundTrip sends a line and waits for it to come back.
func (e *echo) roundTrip(timeout time.Duration) error {
	e.n++
	line := fmt.Sprintf("galactic %d\n", e.n)
	_ = e.conn.SetDeadline(time.Now().Add(timeout))
	if _, err := e.conn.Write([]byte(line)); err != nil {
		return err
	}
	got, err := e.r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line {
		return fmt.Errorf("echoed %q, sent %q", got, line)
	}
	return nil
}

// TestALiveMigrationKeepsTheGuestItsConnectionAndChangesTheRouteOnce is
// a real live migration from node-a to node-b under a 10 ms pinger from
// node-c: the guest keeps running (its uptime goes on), a TCP connection
// from node-c survives, node-c's route changes once, the lease has one
// holder at every version, and node-b sends nothing to the standby tap
// before promote.
func TestALiveMigrationKeepsTheGuestItsConnectionAndChangesTheRouteOnce(t *testing.T) {
	cl := newCluster(t)
	l := cl.runningGuest(t, guestAssets(t), "live")
	wc, conn, before, token := l.wc, l.conn, l.uptime, l.token
	leases := cl.watchLease(t, l.vm)
	routes := watchRoute(t, cl.c, l.vm.Prefix())
	pinger := harness.Ping(t, wc, l.vm.Addr(false))
	pinger.WaitReplies(t, 20)
	m := cl.migration(t, l.vm, cl.a, cl.b, l.src)
	m.VMM = l.qemu
	var sent *harness.TapCounter
	var beforePromote int64
	m.AfterStandby = func() error {
		ifs := hostInterfaces(t, cl.b, l.vm)
		if len(ifs) != 1 {
			return fmt.Errorf("node-b has host interfaces %v", ifs)
		}
		var err error
		sent, err = cl.b.CountSent(ifs[0], l.vm.Addr(false))
		return err
	}
	m.BeforePromote = func() error {
		beforePromote = sent.Stop()
		return nil
	}
	res, err := m.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, hangGuard, "the guest answers on node-b", func() error { return wc.Ping(l.vm.Addr(false)) })
	if err := conn.roundTrip(20 * time.Second); err != nil {
		t.Fatalf("the TCP connection did not survive the migration: %v", err)
	}
	cl.settled(t, l.vm, cl.b)
	st := pinger.Stop()

	after, err := l.qemu.Target.UptimeNow(10 * time.Second)
	if err != nil {
		t.Fatalf("%v; console on node-b:\n%s", err, l.qemu.Target.Console())
	}
	if after <= before || strings.Contains(l.qemu.Target.Console(), vm.MarkerReady) {
		t.Errorf("the guest rebooted: uptime %s before, %s after; console on node-b:\n%s", before, after, l.qemu.Target.Console())
	}
	if beforePromote != 0 {
		t.Errorf("node-b sent %d packets to the standby tap before promote", beforePromote)
	}
	ch := routes.Changes()
	if len(ch) != 1 || ch[0].Deleted || ch[0].Via != cl.b.Underlay {
		t.Fatalf("node-c's route: want one change to via %s, got %v", cl.b.Underlay, ch)
	}
	versions, werr := leases.Versions()
	if werr != nil {
		t.Fatal(werr)
	}
	if err := harness.OneHolder(versions); err != nil {
		t.Fatalf("%v in %+v", err, versions)
	}
	if last := versions[len(versions)-1]; last.Holder != cl.b.HolderOf(m.Target.Container) || last.Token != token+1 {
		t.Fatalf("lease after the migration: %+v", last)
	}
	tm := res.Timings
	// Replies stop around the pause: the longest silence lies within the
	// migration, between the standby ADD and the guest's resume.
	if gapEnd := st.LongestGapFrom.Add(st.LongestGap); st.LongestGapFrom.Before(tm.Standby) || gapEnd.Before(tm.Migrated) {
		t.Errorf("the longest silence (%s from %s) is not around the pause (migrate %s..%s, resumed %s)",
			st.LongestGap, st.LongestGapFrom.Format("15:04:05.000"), tm.Standby.Format("15:04:05.000"), tm.Migrated.Format("15:04:05.000"), tm.Resumed.Format("15:04:05.000"))
	}
	t.Logf("migration: total %s (standby ADD %s, qemu migrate %s, release %s, promote %s, resume %s, source DEL %s)",
		tm.SourceDeleted.Sub(tm.Start), tm.Standby.Sub(tm.Start), tm.Migrated.Sub(tm.Standby), tm.Released.Sub(tm.Migrated),
		tm.Promoted.Sub(tm.Released), tm.Resumed.Sub(tm.Promoted), tm.SourceDeleted.Sub(tm.Resumed))
	t.Logf("blackout (longest gap between answered pings, 10 ms): %s; lost %d of %d; qemu downtime %s; release returned -> node-c's route changed %s",
		st.LongestGap, st.Lost, st.Sent, tm.QEMUDowntime, ch[0].At.Sub(tm.Released))
	t.Logf("node-b's promote: %s", logLine(t, cl.b, `"verb":"promote"`, `"outcome":"ok"`))
}

// logLine is the last line of the node's galactic log with every one of
// the fragments.
func logLine(t *testing.T, n *harness.Routed, fragments ...string) string {
	t.Helper()
	data, err := os.ReadFile(n.Settings.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	found := ""
	for _, line := range strings.Split(string(data), "\n") {
		ok := true
		for _, f := range fragments {
			ok = ok && strings.Contains(line, f)
		}
		if ok {
			found = line
		}
	}
	return found
}

// TestATargetKilledAfterTheReleaseLeavesTheGuestRunningOnTheSource: the
// incoming qemu dies between the source's release and the target's
// promote; the source promotes itself back with a new token and resumes
// the guest, which keeps its uptime and connection, and node-c's route
// never leaves node-a.
func TestATargetKilledAfterTheReleaseLeavesTheGuestRunningOnTheSource(t *testing.T) {
	cl := newCluster(t)
	l := cl.runningGuest(t, guestAssets(t), "fallback-vm")
	wc, conn, before, token := l.wc, l.conn, l.uptime, l.token
	routes := watchRoute(t, cl.c, l.vm.Prefix())
	m := cl.migration(t, l.vm, cl.a, cl.b, l.src)
	m.VMM = l.qemu
	killed := errors.New("the target's qemu was killed")
	m.BeforePromote = func() error {
		l.qemu.Target.Kill()
		return killed
	}
	res, err := m.Run(t.Context())
	if !errors.Is(err, killed) || !res.FellBack || res.SourcePromote.Code != migration.ExitOK {
		t.Fatalf("want the source to take the attachment back: err %v, result %+v", err, res)
	}
	harness.Eventually(t, hangGuard, "the guest answers on node-a again", func() error { return wc.Ping(l.vm.Addr(false)) })
	if err := conn.roundTrip(20 * time.Second); err != nil {
		t.Fatalf("the TCP connection did not survive: %v", err)
	}
	after, err := l.qemu.Source.UptimeNow(10 * time.Second)
	if err != nil || after <= before {
		t.Errorf("the guest's uptime: %s before, %s after (%v)", before, after, err)
	}
	lease := cl.env.Lease(t, l.vm.LeaseName())
	if harness.LeaseHolder(lease) != cl.a.HolderOf(l.src) || harness.LeaseToken(lease) != token+1 {
		t.Fatalf("lease: %s token %d, want %s token %d", harness.LeaseHolder(lease), harness.LeaseToken(lease), cl.a.HolderOf(l.src), token+1)
	}
	if e := cl.env.Advertisement(t, l.vm, cl.a.Name).Spec.Containers[0]; e.HolderGeneration != token+1 || e.Standby {
		t.Fatalf("node-a's entry: %+v", e)
	}
	cl.c.WaitRouteVia(t, vpc, l.vm.Prefix(), cl.a.Underlay)
	for _, c := range routes.Changes() {
		if c.Deleted || c.Via != cl.a.Underlay {
			t.Fatalf("node-c's route left node-a: %v", routes.Changes())
		}
	}
	if ifs := hostInterfaces(t, cl.b, l.vm); len(ifs) != 0 {
		t.Errorf("node-b kept %v", ifs)
	}
	t.Logf("fall-back: the source's promote took %s", res.SourcePromote.Took)
}

// TestTenLiveMigrationsBackAndForth moves a running guest between node-a
// and node-b ten times under a 10 ms pinger from node-c, reports the
// blackout of each (total, qemu's downtime, galactic's part: release
// returned until node-c's route changed) and checks that each changed
// node-c's route once and that nothing of the guest is left on the node
// it left.
func TestTenLiveMigrationsBackAndForth(t *testing.T) {
	cl := newCluster(t)
	l := cl.runningGuest(t, guestAssets(t), "ten-vm")
	wc, conn := l.wc, l.conn
	routes := watchRoute(t, cl.c, l.vm.Prefix())
	pinger := harness.Ping(t, wc, l.vm.Addr(false))
	pinger.WaitReplies(t, 20)
	dir := shortDir(t)
	q, src := l.qemu, l.src
	from, to := cl.a, cl.b
	var runs []migration.Timings
	for i := range 10 {
		m := cl.migration(t, l.vm, from, to, src)
		m.VMM = q
		res, err := m.Run(t.Context())
		if err != nil {
			t.Fatalf("migration %d from %s to %s: %v", i+1, from.Name, to.Name, err)
		}
		t.Cleanup(q.StopTarget)
		runs = append(runs, res.Timings)
		cl.c.WaitRouteVia(t, vpc, l.vm.Prefix(), to.Underlay)
		harness.Eventually(t, hangGuard, "the guest answers on "+to.Name, func() error { return wc.Ping(l.vm.Addr(false)) })
		if ifs := hostInterfaces(t, from, l.vm); len(ifs) != 0 {
			t.Errorf("migration %d left %v on %s", i+1, ifs, from.Name)
		}
		q = q.Next(from.Node, from.Underlay, filepath.Join(dir, fmt.Sprintf("%d.qmp", i)))
		src, from, to = m.Target.Container, to, from
	}
	if err := conn.roundTrip(20 * time.Second); err != nil {
		t.Fatalf("the TCP connection did not survive ten migrations: %v", err)
	}
	cl.settled(t, l.vm, from)
	pinger.Stop()
	ch := routes.Changes()
	if len(ch) != len(runs) {
		t.Errorf("node-c's route changed %d times in %d migrations: %v", len(ch), len(runs), ch)
	}
	var total, downtime, galactic []time.Duration
	for i, tm := range runs {
		end := tm.SourceDeleted
		if i+1 < len(runs) {
			end = runs[i+1].Start
		}
		st := pinger.StatsBetween(tm.Start.Add(-200*time.Millisecond), end)
		part := time.Duration(-1)
		for _, c := range ch {
			if c.At.After(tm.Released) {
				part = c.At.Sub(tm.Released)
				break
			}
		}
		total, downtime, galactic = append(total, st.LongestGap), append(downtime, tm.QEMUDowntime), append(galactic, part)
		t.Logf("migration %2d: blackout %s, qemu downtime %s, galactic %s (release %s, promote %s)",
			i+1, st.LongestGap.Round(time.Millisecond), tm.QEMUDowntime, part.Round(time.Millisecond),
			tm.Released.Sub(tm.Migrated).Round(time.Millisecond), tm.Promoted.Sub(tm.Released).Round(time.Millisecond))
	}
	t.Logf("blackout p50 %s p99 %s; qemu downtime p50 %s p99 %s; galactic p50 %s p99 %s",
		percentile(total, 50), percentile(total, 99), percentile(downtime, 50), percentile(downtime, 99), percentile(galactic, 50), percentile(galactic, 99))
}

// percentile is the nearest-rank percentile of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := (p*len(s)+99)/100 - 1
	return s[max(i, 0)].Round(time.Millisecond)
}
