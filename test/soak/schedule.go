package soak

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Attachment is one workload the schedule moves around.
type Attachment struct {
	VPC, Name string
	VNI       int
	// Address is the workload's address (/24); Peer names the attachment
	// of the other VPC holding the same address, which must never share a
	// node with it (table routing cannot hold one address twice).
	Address  string
	Announce string
	Peer     string
	// VM: a qemu guest on a tap, which only live migration moves.
	VM bool
	// Namespace, when set, makes the attachment object-backed: a
	// VPCAttachment of that name in the namespace, in the VPC of that
	// name, whose status the plugins read.
	Namespace string
}

// Key is "<vpc>/<name>".
func (a Attachment) Key() string { return a.VPC + "/" + a.Name }

// Topology is what a schedule is planned over.
type Topology struct {
	// Nodes may host attachments; Crashable may also crash or be cut off
	// from the API (the node hosting clients and canaries is not).
	Nodes, Crashable []string
	Attachments      []Attachment
	// Initial is where each attachment starts, by key.
	Initial map[string]string
	// LeaseSeconds is the handoff lease duration.
	LeaseSeconds int
	// OutageMax is the longest API outage planned (the 60 s; a
	// short soak plans shorter ones).
	OutageMax time.Duration
}

// Step is one entry of a schedule: a workload operation, or the start or
// the end of a fault.
type Step struct {
	Seq  int
	At   time.Duration
	Kind string
	// End marks the end of a fault started by step Start.
	End   bool
	Start int
	// Attachment (a key), Node and To parameterise the step; For is a
	// fault's planned length; Percent a loss rate; Available a flip's
	// direction; Kill when a plugin is killed, after KillAfter.
	Attachment string
	Node, To   string
	For        time.Duration
	Percent    int
	Available  bool
	Verb       string
	KillAfter  time.Duration
	// Moves are the takeovers a crash or a cut-off plans: attachment key
	// to the node it is rescheduled on.
	Moves map[string]string
}

// end is the step ending fault s: the same parameters, numbered seq.
func (s Step) end(seq int, at time.Duration) Step {
	e := s
	e.Seq, e.At, e.End, e.Start = seq, at, true, s.Seq
	return e
}

func (s Step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d +%5.1fs %s", s.Seq, s.At.Seconds(), s.Kind)
	if s.End {
		fmt.Fprintf(&b, " end (of #%d)", s.Start)
		if s.Node != "" {
			b.WriteString(" on " + s.Node)
		}
		return b.String()
	}
	if s.Attachment != "" {
		b.WriteString(" " + s.Attachment)
	}
	if s.Node != "" {
		b.WriteString(" on " + s.Node)
	}
	if s.To != "" {
		b.WriteString(" to " + s.To)
	}
	if s.Verb != "" {
		fmt.Fprintf(&b, " %s killed after %s", s.Verb, s.KillAfter)
	}
	if s.Kind == "flip" {
		fmt.Fprintf(&b, " available=%v", s.Available)
	}
	if s.Percent > 0 {
		fmt.Fprintf(&b, " %d%%", s.Percent)
	}
	if s.For > 0 {
		fmt.Fprintf(&b, " for %s", s.For.Round(100*time.Millisecond))
	}
	for _, k := range sortedKeys(s.Moves) {
		fmt.Fprintf(&b, " %s->%s", k, s.Moves[k])
	}
	return b.String()
}

// Plan is the state a schedule is planned against: where each attachment
// runs ("" when deleted), whether it reports available, which nodes are
// down (crashed) or cut off, and until when the API is out.
type Plan struct {
	Topo      Topology
	Where     map[string]string
	Available map[string]bool
	Down      map[string]bool
	APIDown   bool
	// Now is the planned time of the step being planned.
	Now time.Duration
}

// Up are the nodes not down, in order.
func (p *Plan) Up() []string {
	var out []string
	for _, n := range p.Topo.Nodes {
		if !p.Down[n] {
			out = append(out, n)
		}
	}
	return out
}

// Fits reports whether attachment key may run on node: the node is up and
// does not host its peer.
func (p *Plan) Fits(key, node string) bool {
	if p.Down[node] {
		return false
	}
	a := p.Topo.attachment(key)
	return a.Peer == "" || p.Where[a.Peer] != node
}

func (t Topology) attachment(key string) Attachment {
	for _, a := range t.Attachments {
		if a.Key() == key {
			return a
		}
	}
	return Attachment{}
}

// Kind is one kind of step. Plan proposes a step in the planned state and
// applies it to the plan, false when it does not apply now; a fault
// (Fault) also gets an end step after For, planned by EndPlan.
type Kind struct {
	Name   string
	Fault  bool
	Weight int
	Plan   func(r *rand.Rand, p *Plan, s *Step) bool
	// EndPlan applies the end of the fault to the plan.
	EndPlan func(p *Plan, s *Step)
	// Blackout is the longest outage a reachable attachment may see
	// because of this step, from its start to its end plus Settle; 0
	// means the step's blackouts are recorded but not bounded.
	Blackout time.Duration
	// Routing faults leave routes stale, not wrong: a receiver's route may
	// lag the holder while one is active and for RoutingGrace after.
	Routing bool
	// Stalls: while this fault runs, a route change may not reach the
	// receivers at all (the reflector, or a router, is down): it waits for
	// the fault's end.
	Stalls bool
}

var kinds []Kind

// Register adds a kind of step to the registry the schedule draws from.
func Register(k Kind) {
	if slices.ContainsFunc(kinds, func(o Kind) bool { return o.Name == k.Name }) {
		panic("soak: kind registered twice: " + k.Name)
	}
	kinds = append(kinds, k)
}

// KindOf is the registered kind called name.
func KindOf(name string) (Kind, bool) {
	for _, k := range kinds {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

// Kinds are the registered kinds' names.
func Kinds() []string {
	var out []string
	for _, k := range kinds {
		out = append(out, k.Name)
	}
	return out
}

// Schedule plans steps for duration from seed: workload operations every
// 1.5-4 s, and one fault at a time, 3-8 s after the previous one ended.
// Workload operations pause while the API is out. The same seed, duration
// and topology always give the same schedule.
func Schedule(seed uint64, duration time.Duration, topo Topology) []Step {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := &Plan{Topo: topo, Where: map[string]string{}, Available: map[string]bool{}, Down: map[string]bool{}}
	for _, a := range topo.Attachments {
		p.Where[a.Key()] = topo.Initial[a.Key()]
		p.Available[a.Key()] = true
	}
	var steps []Step
	var workload, faults []Kind
	for _, k := range kinds {
		if k.Fault {
			faults = append(faults, k)
		} else {
			workload = append(workload, k)
		}
	}
	nextOp := between(r, 1500*time.Millisecond, 4*time.Second)
	nextFault := between(r, 2*time.Second, 6*time.Second)
	open := -1 // the index of the fault running now
	endFault := func(at time.Duration) {
		f := steps[open]
		steps = append(steps, f.end(len(steps), at))
		if k, _ := KindOf(f.Kind); k.EndPlan != nil {
			k.EndPlan(p, &f)
		}
		open = -1
	}
	for {
		faultAt := nextFault
		if open >= 0 {
			faultAt = steps[open].At + steps[open].For
		}
		at := min(nextOp, faultAt)
		if at >= duration {
			break
		}
		p.Now = at
		switch {
		case at == faultAt && open >= 0:
			endFault(at)
			nextFault = at + between(r, 3*time.Second, 8*time.Second)
		case at == faultAt:
			s := Step{At: at}
			if k, ok := pick(r, faults, p, &s); ok {
				s.Kind, s.Seq = k.Name, len(steps)
				steps = append(steps, s)
				open = s.Seq
			} else {
				nextFault = at + time.Second
			}
		default:
			s := Step{At: at}
			if !p.APIDown {
				if k, ok := pick(r, workload, p, &s); ok {
					s.Kind, s.Seq = k.Name, len(steps)
					steps = append(steps, s)
				}
			}
			nextOp = at + between(r, 1500*time.Millisecond, 4*time.Second)
		}
	}
	if open >= 0 {
		endFault(duration)
	}
	return steps
}

// pick draws kinds by weight until one applies (a few tries).
func pick(r *rand.Rand, ks []Kind, p *Plan, s *Step) (Kind, bool) {
	total := 0
	for _, k := range ks {
		total += k.Weight
	}
	for try := 0; try < 8 && total > 0; try++ {
		n := r.IntN(total)
		for _, k := range ks {
			if n < k.Weight {
				at := s.At
				*s = Step{At: at}
				if k.Plan(r, p, s) {
					if k.Fault && s.For <= 0 {
						s.For = time.Millisecond
					}
					return k, true
				}
				break
			}
			n -= k.Weight
		}
	}
	return Kind{}, false
}

func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1)).Round(100*time.Millisecond)
}

func choose[T any](r *rand.Rand, xs []T) (T, bool) {
	var zero T
	if len(xs) == 0 {
		return zero, false
	}
	return xs[r.IntN(len(xs))], true
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// Prefix is the schedule cut after step n, with the faults open at the
// cut still ending when planned: what a violation's reproduction replays.
func Prefix(steps []Step, n int) []Step {
	if n+1 >= len(steps) {
		return steps
	}
	out := slices.Clone(steps[:n+1])
	for _, e := range steps[n+1:] {
		if e.End && e.Start <= n {
			e.Seq = len(out)
			out = append(out, e)
		}
	}
	return out
}
