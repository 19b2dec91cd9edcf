package bench

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
)

// faultOutage is how long the reflector stays away in the Routing
// section's fault step: the minute.
const faultOutage = 60 * time.Second

// FaultResult is the fault step of the Routing section.
type FaultResult struct {
	// Outage: the only reflector (FRR, no graceful restart) stopped while a
	// container on C pings one on A every 10 ms; Sent and Lost count the
	// pings from the stop until past the hold after both routers' next
	// End-of-RIB, KernelChanges the route changes of the two prefixes at C
	// and A in that time.
	Outage        time.Duration
	Sent, Lost    int
	KernelChanges int
	// Flapping: FRR resets its session with C every second; FlapCPU is C's
	// router's CPU time over Flapping, FlapChanges C's route changes.
	Flapping, FlapCPU time.Duration
	Resets            int
	FlapChanges       int
}

// faults runs the fault step: A holds a resident attachment, C pings it.
func (b *bench) faults(r *RoutingResult, f *harness.Fabric, a, c *routedNode, from *harness.Netns) error {
	target, err := b.container()
	if err != nil {
		return err
	}
	addr := "10.20.5.5/16"
	if _, err := b.addConf(a, routedConf(routingVPC, "fault-0", "veth", []string{addr}, false, ""), target); err != nil {
		return err
	}
	p, src := host(addr), host("10.20.2.12/16")
	if err := waitPing(from, p.Addr(), 30*time.Second); err != nil {
		return err
	}
	monA, err := watchRoutes(a.Node)
	if err != nil {
		return err
	}
	defer monA.stop()
	monC, err := watchRoutes(c.Node)
	if err != nil {
		return err
	}
	defer monC.stop()
	res := &FaultResult{Outage: faultOutage}
	r.Faults = res

	markA, markC := monA.mark(), monC.mark()
	eorA, eorC := a.router.LogCount(`"msg":"End-of-RIB"`), c.router.LogCount(`"msg":"End-of-RIB"`)
	pg, err := from.StartPinger(p.Addr(), 10*time.Millisecond)
	if err != nil {
		return err
	}
	f.StopFRR()
	time.Sleep(faultOutage)
	if err := f.StartFRR(); err != nil {
		pg.Stop()
		return err
	}
	deadline := time.Now().Add(90 * time.Second)
	for a.router.LogCount(`"msg":"End-of-RIB"`) <= eorA || c.router.LogCount(`"msg":"End-of-RIB"`) <= eorC {
		if time.Now().After(deadline) {
			pg.Stop()
			return fmt.Errorf("no End-of-RIB on both routers within 90 s of the reflector's return")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Past the withdrawal hold, within which a withdrawal would act.
	time.Sleep(12 * time.Second)
	st := pg.Stop()
	res.Sent, res.Lost = st.Sent, st.Lost
	res.KernelChanges = monC.count(markC, p) + monA.count(markA, src)
	b.say("Routing: reflector stopped for %s: %d of %d pings lost, %d kernel route changes", faultOutage, res.Lost, res.Sent, res.KernelChanges)

	markC = monC.mark()
	cpu0, err := c.router.CPUTime()
	if err != nil {
		return err
	}
	begin := time.Now()
	for time.Since(begin) < faultOutage {
		if _, err := f.Vtysh("clear bgp " + c.underlay.String()); err == nil {
			res.Resets++
		}
		time.Sleep(time.Second)
	}
	cpu1, err := c.router.CPUTime()
	if err != nil {
		return err
	}
	res.Flapping, res.FlapCPU = time.Since(begin), cpu1-cpu0
	res.FlapChanges = monC.count(markC, p)
	b.say("Routing: FRR reset C's session %d times in %s: C's router used %s of CPU, %d kernel route changes", res.Resets, ms(res.Flapping), ms(res.FlapCPU), res.FlapChanges)
	return nil
}

// waitPing waits until from reaches addr.
func waitPing(from *harness.Netns, addr netip.Addr, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := from.Ping(addr)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not reachable within %s: %w", addr, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func renderFaults(p func(string, ...any), res *FaultResult) {
	if res == nil {
		return
	}
	share := 0.0
	if res.Flapping > 0 {
		share = 100 * float64(res.FlapCPU) / float64(res.Flapping)
	}
	p("**Faults.** FRR, the only reflector, configured without graceful restart, is stopped for %s while a container on C pings one on A every 10 ms: %d of %d pings lost, %d kernel route changes at C and A for the two prefixes, counted until past the withdrawal hold after both routers' End-of-RIB from the returned reflector (the routers keep a lost session's routes stale, not gone, until then). Then FRR resets its session with C every second (`clear bgp`) for %s (%d resets): C's router used %s of CPU, %.1f%% of a core, and C's route for the prefix changed %d times.",
		res.Outage, res.Lost, res.Sent, res.KernelChanges, ms(res.Flapping), res.Resets, ms(res.FlapCPU), share, res.FlapChanges)
	p("")
}
