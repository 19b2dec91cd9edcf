package soak

import (
	"math/rand/v2"
	"syscall"
	"time"
)

// World is what steps act on: the real topology (Run) or the simulation
// the checkers are tested on. Each method returns once the operation is
// done, as a runtime or an operator would see it done.
type World interface {
	Create(key, node string) error
	Delete(key string) error
	Upgrade(key string) error
	Move(key, to string) error
	// Migrate moves key's running instance to another node as a live
	// migration does: standby ADD on to, release on the source, promote
	// on to, DEL of the source (docs/concepts/live-migration.md).
	Migrate(key, to string) error
	Flip(key string, available bool) error
	// KillPlugin runs verb (add or del) for key on node and kills the
	// plugin chain after a while, then retries as a runtime does.
	KillPlugin(key, node, verb string, after time.Duration) error
	StopRouter(node string, sig syscall.Signal) error
	StartRouter(node string) error
	StopGC(node string, sig syscall.Signal) error
	StartGC(node string) error
	// Crash takes node off the fabric and the API, kills its daemons and
	// workloads without a DEL, and reschedules them as moves says.
	Crash(node string, moves map[string]string) error
	Return(node string) error
	// CutOff cuts node from the API and reschedules as moves says while
	// the node's instances still run; Reconnect restores the API and
	// deletes the instances that were replaced.
	CutOff(node string, moves map[string]string) error
	Reconnect(node string) error
	SetAPI(up bool) error
	StopReflector() error
	StartReflector() error
	SetLoss(percent int) error
	// CycleAttachment makes the Delete attachment key, waits until it is
	// Ready, runs a workload of it on node (none when node is "") and
	// stops it, deletes it and checks its addresses went back to the VPC.
	CycleAttachment(key, node string) error
	// RebindRetained deletes the Retain attachment key (its workload
	// first) and makes it again by the same name: same addresses, a new
	// UID; with node set a workload of it runs there afterwards, holding
	// nothing of the old UID.
	RebindRetained(key, node string) error
}

// runFunc executes a step's start or end against a World.
type runFunc func(w World, s Step) error

var runs = map[string][2]runFunc{}

// RunStep executes s (a start or an end) against w.
func RunStep(w World, s Step) error {
	r := runs[s.Kind]
	if s.End {
		return r[1](w, s)
	}
	return r[0](w, s)
}

// register adds a kind with its start and (for faults) end executors.
func register(k Kind, start, end runFunc) {
	Register(k)
	runs[k.Name] = [2]runFunc{start, end}
}

// SettleTime is how long after a step its blackout is still measured.
const SettleTime = 3 * time.Second

// TakeoverBound is how long an attachment rescheduled from a lost node may
// be unreachable beyond the lease's expiry: the ADD's wait polls, the
// takeover's ADD, the announcement through FRR, the receiver's install.
const TakeoverBound = 25 * time.Second

// MigrationBound is a live migration's blackout bound: the p99 goal of
// docs/concepts/live-migration.md (500 ms, which its measurements under TCG on this
// machine meet) plus one ping interval of the soak's 50 ms pingers.
const MigrationBound = 500*time.Millisecond + pingInterval

// StalledBound is the bound of a workload operation that needs a route
// change while a fault that stalls route changes runs: the move's, whose
// change may wait as long.
const StalledBound = 20 * time.Second

// NoLossBound is the bound of faults that should lose nothing (the kernel
// keeps what the router programmed; an API outage changes nothing): a
// margin for a loaded 2-core machine, not a budget.
const NoLossBound = 3 * time.Second

// present are the containers running on nodes that are up; absent those
// deleted. A VM is neither: only live migration moves it.
func (p *Plan) present() (out []string) {
	for _, a := range p.Topo.Attachments {
		if n := p.Where[a.Key()]; n != "" && !p.Down[n] && !a.VM {
			out = append(out, a.Key())
		}
	}
	return out
}

func (p *Plan) absent() (out []string) {
	for _, a := range p.Topo.Attachments {
		if p.Where[a.Key()] == "" && !a.VM {
			out = append(out, a.Key())
		}
	}
	return out
}

func (p *Plan) fitting(key string, except string) (out []string) {
	for _, n := range p.Topo.Nodes {
		if n != except && p.Fits(key, n) {
			out = append(out, n)
		}
	}
	return out
}

// migratable are the attachments a live migration may move: the running
// containers and VMs.
func (p *Plan) migratable() (out []string) {
	for _, a := range p.Topo.Attachments {
		if n := p.Where[a.Key()]; n != "" && !p.Down[n] {
			out = append(out, a.Key())
		}
	}
	return out
}

// relocate plans moving one of candidates' attachments to another node
// that fits it.
func relocate(candidates func(*Plan) []string) func(r *rand.Rand, p *Plan, s *Step) bool {
	return func(r *rand.Rand, p *Plan, s *Step) bool {
		key, ok := choose(r, candidates(p))
		if !ok {
			return false
		}
		to, ok := choose(r, p.fitting(key, p.Where[key]))
		if !ok {
			return false
		}
		s.Attachment, s.Node, s.To = key, p.Where[key], to
		p.Where[key], p.Available[key] = to, true
		return true
	}
}

// hostsVM reports whether a VM runs on node: the node is not crashed or
// cut off, because its guest could only be booted afresh elsewhere.
func (p *Plan) hostsVM(node string) bool {
	for _, a := range p.Topo.Attachments {
		if a.VM && p.Where[a.Key()] == node {
			return true
		}
	}
	return false
}

// reschedule plans where the attachments on node go when it is lost.
func (p *Plan) reschedule(r *rand.Rand, node string) map[string]string {
	moves := map[string]string{}
	p.Down[node] = true
	for _, a := range p.Topo.Attachments {
		if p.Where[a.Key()] != node {
			continue
		}
		if to, ok := choose(r, p.fitting(a.Key(), node)); ok {
			moves[a.Key()] = to
			p.Where[a.Key()] = to
			p.Available[a.Key()] = true
		} else {
			p.Where[a.Key()] = ""
		}
	}
	return moves
}

// planCreate places an absent attachment on a node that can take it.
func planCreate(r *rand.Rand, p *Plan, s *Step) bool {
	key, ok := choose(r, p.absent())
	if !ok {
		return false
	}
	node, ok := choose(r, p.fitting(key, ""))
	if !ok {
		return false
	}
	s.Attachment, s.Node = key, node
	p.Where[key], p.Available[key] = node, true
	return true
}

// planDelete removes a present attachment from its node.
func planDelete(r *rand.Rand, p *Plan, s *Step) bool {
	key, ok := choose(r, p.present())
	if !ok {
		return false
	}
	s.Attachment, s.Node = key, p.Where[key]
	p.Where[key] = ""
	return true
}

func init() {
	register(Kind{Name: "create", Weight: 3, Plan: planCreate},
		func(w World, s Step) error { return w.Create(s.Attachment, s.Node) }, nil)

	register(Kind{Name: "delete", Weight: 2, Plan: planDelete},
		func(w World, s Step) error { return w.Delete(s.Attachment) }, nil)

	// The object kinds run their workloads on a node that never crashes
	// or loses the API, half of the time: a bare attachment's life is
	// the controller's alone.
	objectNode := func(r *rand.Rand) string {
		if r.IntN(2) == 0 {
			return ""
		}
		return objectWorkloadNode
	}
	register(Kind{Name: "attachment-create-delete", Weight: 2, Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
		s.Attachment, s.Node = cycled.Key(), objectNode(r)
		return true
	}}, func(w World, s Step) error { return w.CycleAttachment(s.Attachment, s.Node) }, nil)

	register(Kind{Name: "retain-rebind", Weight: 2, Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
		s.Attachment, s.Node = keeper.Key(), objectNode(r)
		return true
	}}, func(w World, s Step) error { return w.RebindRetained(s.Attachment, s.Node) }, nil)

	register(Kind{Name: "upgrade", Weight: 3, Blackout: 15 * time.Second, Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
		key, ok := choose(r, p.present())
		if !ok {
			return false
		}
		s.Attachment, s.Node = key, p.Where[key]
		p.Available[key] = true
		return true
	}}, func(w World, s Step) error { return w.Upgrade(s.Attachment) }, nil)

	register(Kind{Name: "move", Weight: 4, Blackout: 20 * time.Second, Plan: relocate((*Plan).present)},
		func(w World, s Step) error { return w.Move(s.Attachment, s.To) }, nil)

	register(Kind{Name: "migrate", Weight: 2, Blackout: MigrationBound, Plan: relocate((*Plan).migratable)},
		func(w World, s Step) error { return w.Migrate(s.Attachment, s.To) }, nil)

	register(Kind{Name: "flip", Weight: 2, Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
		var whenAvailable []string
		for _, key := range p.present() {
			if p.Topo.attachment(key).Announce == "whenAvailable" {
				whenAvailable = append(whenAvailable, key)
			}
		}
		key, ok := choose(r, whenAvailable)
		if !ok {
			return false
		}
		s.Attachment, s.Node, s.Available = key, p.Where[key], !p.Available[key]
		p.Available[key] = s.Available
		return true
	}}, func(w World, s Step) error { return w.Flip(s.Attachment, s.Available) }, nil)

	register(Kind{Name: "plugin-kill", Weight: 2, Blackout: 20 * time.Second, Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
		s.KillAfter = between(r, 50*time.Millisecond, 600*time.Millisecond)
		if r.IntN(2) == 0 {
			s.Verb = "add"
			return planCreate(r, p, s)
		}
		s.Verb = "del"
		return planDelete(r, p, s)
	}}, func(w World, s Step) error { return w.KillPlugin(s.Attachment, s.Node, s.Verb, s.KillAfter) }, nil)

	daemon := func(name string, sig syscall.Signal, stalls bool, stop func(World, string, syscall.Signal) error, start func(World, string) error) {
		register(Kind{Name: name, Fault: true, Weight: 2, Routing: true, Stalls: stalls, Blackout: NoLossBound,
			Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
				node, ok := choose(r, p.Up())
				s.Node, s.For = node, between(r, time.Second, 6*time.Second)
				return ok
			}},
			func(w World, s Step) error { return stop(w, s.Node, sig) },
			func(w World, s Step) error { return start(w, s.Node) })
	}
	daemon("router-kill", syscall.SIGKILL, true, World.StopRouter, World.StartRouter)
	daemon("router-term", syscall.SIGTERM, true, World.StopRouter, World.StartRouter)
	daemon("gc-kill", syscall.SIGKILL, false, World.StopGC, World.StartGC)
	daemon("gc-term", syscall.SIGTERM, false, World.StopGC, World.StartGC)

	register(Kind{Name: "node-crash", Fault: true, Weight: 2, Routing: true, Blackout: NoLossBound,
		Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
			var up []string
			for _, n := range p.Topo.Crashable {
				if !p.Down[n] && !p.hostsVM(n) {
					up = append(up, n)
				}
			}
			node, ok := choose(r, up)
			if !ok {
				return false
			}
			s.Node, s.For = node, between(r, 8*time.Second, 20*time.Second)
			s.Moves = p.reschedule(r, node)
			return true
		},
		EndPlan: func(p *Plan, s *Step) { p.Down[s.Node] = false }},
		func(w World, s Step) error { return w.Crash(s.Node, s.Moves) },
		func(w World, s Step) error { return w.Return(s.Node) })

	register(Kind{Name: "api-cutoff", Fault: true, Weight: 2, Blackout: NoLossBound,
		Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
			node, ok := choose(r, p.Topo.Crashable)
			if !ok || p.Down[node] || p.hostsVM(node) {
				return false
			}
			// Longer than the lease: its holders' renewals stop and the
			// takeovers win the lease once it expires.
			s.Node = node
			s.For = time.Duration(p.Topo.LeaseSeconds)*time.Second + between(r, 8*time.Second, 20*time.Second)
			s.Moves = p.reschedule(r, node)
			return true
		},
		EndPlan: func(p *Plan, s *Step) { p.Down[s.Node] = false }},
		func(w World, s Step) error { return w.CutOff(s.Node, s.Moves) },
		func(w World, s Step) error { return w.Reconnect(s.Node) })

	register(Kind{Name: "api-outage", Fault: true, Weight: 2, Routing: true, Blackout: NoLossBound,
		Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
			s.For = between(r, 5*time.Second, max(p.Topo.OutageMax, 5*time.Second))
			p.APIDown = true
			return true
		},
		EndPlan: func(p *Plan, s *Step) { p.APIDown = false }},
		func(w World, s Step) error { return w.SetAPI(false) },
		func(w World, s Step) error { return w.SetAPI(true) })

	register(Kind{Name: "reflector-restart", Fault: true, Weight: 1, Routing: true, Stalls: true, Blackout: NoLossBound,
		Plan: func(r *rand.Rand, p *Plan, s *Step) bool { s.For = 100 * time.Millisecond; return true }},
		func(w World, s Step) error { return w.StopReflector() },
		func(w World, s Step) error { return w.StartReflector() })

	register(Kind{Name: "reflector-outage", Fault: true, Weight: 2, Routing: true, Stalls: true, Blackout: NoLossBound,
		Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
			s.For = between(r, 5*time.Second, 20*time.Second)
			return true
		}},
		func(w World, s Step) error { return w.StopReflector() },
		func(w World, s Step) error { return w.StartReflector() })

	register(Kind{Name: "packet-loss", Fault: true, Weight: 2, Routing: true, Blackout: NoLossBound,
		Plan: func(r *rand.Rand, p *Plan, s *Step) bool {
			s.Percent, s.For = 2+r.IntN(9), between(r, 5*time.Second, 15*time.Second)
			return true
		}},
		func(w World, s Step) error { return w.SetLoss(s.Percent) },
		func(w World, s Step) error { return w.SetLoss(0) })
}
