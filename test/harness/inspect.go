package harness

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/pkg/tap"
)

// Records are the node's galactic-cni records.
func (n *Node) Records(t testing.TB) []state.Record {
	t.Helper()
	recs, err := state.NewStore(n.Settings.StateDir).List()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// InspectTap reports the node's tap called name; ok is false without one.
func (n *Node) InspectTap(t testing.TB, name string) (st tap.Status, ok bool) {
	t.Helper()
	err := n.Do(func() error {
		var err error
		st, ok, err = tap.Inspect(name)
		return err
	})
	if err != nil {
		t.Fatalf("inspecting %s on %s: %v", name, n.Name, err)
	}
	return st, ok
}

// Snapshot is the node's links, addresses, rules and routes as `ip`
// prints them: two snapshots compare equal when none of them changed.
func (n *Node) Snapshot(t testing.TB) string {
	t.Helper()
	var out strings.Builder
	for _, args := range [][]string{{"-o", "link"}, {"-o", "addr"}, {"rule"}, {"-6", "rule"}, {"route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}} {
		s, err := n.Run("ip", args...)
		if err != nil {
			t.Fatalf("ip %v on %s: %v: %s", args, n.Name, err, s)
		}
		out.WriteString(s)
	}
	return out.String()
}

// CNIError is err's CNI error; t fails when it is not one.
func CNIError(t testing.TB, err error) *types.Error {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a CNI error, got %v", err)
	}
	return e
}
