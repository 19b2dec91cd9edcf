package soak

import (
	"slices"
	"testing"
	"time"
)

func TestTheScheduleIsAFunctionOfTheSeed(t *testing.T) {
	topo := DefaultTopology()
	a := Schedule(7, 2*time.Minute, topo)
	b := Schedule(7, 2*time.Minute, topo)
	if !slices.EqualFunc(a, b, func(x, y Step) bool { return x.String() == y.String() }) {
		t.Fatal("one seed gave two schedules")
	}
	if c := Schedule(8, 2*time.Minute, topo); slices.EqualFunc(a, c, func(x, y Step) bool { return x.String() == y.String() }) {
		t.Fatal("two seeds gave one schedule")
	}
	for _, s := range a {
		t.Log(s)
	}
}

func TestEveryFaultEndsAndNoTwoOverlap(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		steps := Schedule(seed, 10*time.Minute, DefaultTopology())
		open := -1
		for i, s := range steps {
			if s.Seq != i {
				t.Fatalf("seed %d: step %d numbered %d", seed, i, s.Seq)
			}
			k, ok := KindOf(s.Kind)
			if !ok {
				t.Fatalf("seed %d: unknown kind %q", seed, s.Kind)
			}
			switch {
			case s.End:
				if s.Start != open {
					t.Fatalf("seed %d: %s ends #%d, open is #%d", seed, s, s.Start, open)
				}
				open = -1
			case k.Fault:
				if open >= 0 {
					t.Fatalf("seed %d: %s starts while #%d runs", seed, s, open)
				}
				open = s.Seq
			}
		}
		if open >= 0 {
			t.Fatalf("seed %d: fault #%d never ends", seed, open)
		}
	}
}

func TestAPrefixEndsItsFaults(t *testing.T) {
	steps := Schedule(3, 2*time.Minute, DefaultTopology())
	for n := range steps {
		p := Prefix(steps, n)
		open := map[int]bool{}
		for _, s := range p {
			k, _ := KindOf(s.Kind)
			if s.End {
				delete(open, s.Start)
			} else if k.Fault {
				open[s.Seq] = true
			}
		}
		if len(open) > 0 {
			t.Fatalf("prefix %d leaves faults %v open", n, open)
		}
	}
}

func TestThePlanNeverPutsOverlappingAddressesOnOneNode(t *testing.T) {
	topo := DefaultTopology()
	for seed := uint64(0); seed < 100; seed++ {
		where := map[string]string{}
		for k, v := range topo.Initial {
			where[k] = v
		}
		for _, s := range Schedule(seed, 10*time.Minute, topo) {
			if s.End {
				continue
			}
			switch s.Kind {
			case "create", "plugin-kill":
				if s.Verb == "del" {
					where[s.Attachment] = ""
				} else {
					where[s.Attachment] = s.Node
				}
			case "delete":
				where[s.Attachment] = ""
			case "move", "migrate":
				where[s.Attachment] = s.To
			}
			for k, to := range s.Moves {
				where[k] = to
			}
			if s.Kind == "node-crash" || s.Kind == "api-cutoff" {
				for k, n := range where {
					if _, moved := s.Moves[k]; n == s.Node && !moved && !s.End {
						where[k] = ""
					}
				}
			}
			for _, a := range topo.Attachments {
				if n := where[a.Key()]; n != "" && where[a.Peer] == n {
					t.Fatalf("seed %d, %s: %s and %s both on %s", seed, s, a.Key(), a.Peer, n)
				}
			}
		}
	}
}

// The VM is only ever live-migrated, and its node is never crashed or cut
// off from the API.
func TestTheVMIsOnlyMigratedAndItsNodeNeverLost(t *testing.T) {
	topo := WithVM(DefaultTopology())
	key := vmAttachment.Key()
	migrations := 0
	for seed := uint64(0); seed < 50; seed++ {
		at := topo.Initial[key]
		for _, s := range Schedule(seed, 10*time.Minute, topo) {
			if s.End {
				continue
			}
			switch {
			case s.Attachment == key && s.Kind != "migrate":
				t.Fatalf("seed %d: %s", seed, s)
			case s.Attachment == key:
				migrations++
				at = s.To
			case (s.Kind == "node-crash" || s.Kind == "api-cutoff") && s.Node == at:
				t.Fatalf("seed %d: %s while the VM runs there", seed, s)
			}
			if _, moved := s.Moves[key]; moved {
				t.Fatalf("seed %d: %s reschedules the VM", seed, s)
			}
		}
	}
	if migrations == 0 {
		t.Fatal("no seed migrates the VM")
	}
}
