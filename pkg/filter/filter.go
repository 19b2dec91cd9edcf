package filter

import (
	"errors"
	"net"
	"net/netip"
	"slices"
)

// Filter is the node's packet filter as galactic's programs use it: the
// verbs of one attachment (galactic-cni's ADD, DEL and CHECK) and the
// node-wide passes (galactic-gc's sync, galactic-router's VTEPs,
// uninstall). Each call works in the network namespace of the calling
// thread. New gives the kernel's; Off one that does nothing.
type Filter interface {
	// Add restores the tables if they are gone, adds a's elements and
	// attaches the classifier with a's entry to a's interface. previous
	// are what the node's records say the interface had before (a
	// re-ADD, a replacement); their elements a does not have are removed
	// in the same batch. Elements of the interface no record names (an
	// ADD interrupted before its record was written) are left to the
	// GC's pass, which removes whatever no record holds.
	Add(a Attachment, previous ...Attachment) error
	// StartAdd begins Add's work that needs no interface; the Adding it
	// returns finishes it.
	StartAdd(a Attachment, previous ...Attachment) Adding
	// Remove removes every element of the interface and its classifier
	// entry; what is already gone, the table included, is not an error.
	// known are the attachments the node's records say the interface
	// had: their elements are removed without reading the sets, unless
	// the kernel refuses that (records and sets diverged).
	Remove(iface string, known ...Attachment) error
	// StartRemove begins removing the interface's elements, as Remove
	// does, while the caller deletes the interface, which takes the
	// classifier's filter with it; the GC prunes its map entry. The
	// returned function waits and returns the error.
	StartRemove(iface string, known ...Attachment) (wait func() error)
	// Check describes what of a's filter the kernel lacks: the table, a
	// chain or rules, one of its elements, its classifier or entry. Nil
	// when everything is in place.
	Check(a Attachment) error

	// Sync makes the tables, the attachments' elements and the
	// classifier's entries exactly atts: it restores what another agent
	// flushed, attaches the classifier where it is missing, and removes
	// what belongs to interfaces atts does not name. Attachments sharing
	// an interface (a replacement and its predecessor) add up.
	Sync(atts []Attachment) (SyncResult, error)
	// SetVTEPs makes the VTEP sets and the decapsulation program's maps
	// exactly vteps (galactic-router's installed next hops) and its
	// VXLAN devices, restoring the tables first when they are missing.
	SetVTEPs(vteps []netip.Addr) (SyncResult, error)
	// Ensure puts galactic's tables, sets, chains and rules in place when
	// any of them is missing or different, keeping the elements of sets
	// that survive. It reports whether it rebuilt anything.
	Ensure() (bool, error)
	// Delete removes galactic's tables and detaches both programs
	// (uninstall). What is already gone is not an error.
	Delete() error
}

// Adding is an Add under way. Writing the sets' elements and finding the
// namespace's classifier need no interface, so StartAdd begins both while
// the caller creates it; Attach puts the interface's classifier entry and
// filter in place while the caller configures it, and Finish waits for
// all of it. An ADD then takes about as long as it would without the
// filter, whose nftables commit is most of its cost.
type Adding interface {
	// Attach begins attaching the classifier to the interface, index, in
	// the namespace of the calling thread. Finish calls it if the caller
	// has not.
	Attach(index int)
	// Finish attaches the classifier to the interface, index, unless
	// Attach did (then with Attach's index), and waits for it and for the
	// elements.
	Finish(index int) error
	// Wait waits for the elements' write, and for the classifier's if
	// Attach began it, and returns the elements' error; an ADD that fails
	// before Finish calls it before undoing what StartAdd and Attach
	// wrote.
	Wait() error
}

// SyncResult counts what Sync or SetVTEPs changed.
type SyncResult struct {
	Rebuilt        bool
	Added, Removed int
	// Attached counts the interfaces the workload classifier was
	// attached to (missing, or another build's).
	Attached int
}

// ErrNoInterface is Add's error for an interface that does not exist.
var ErrNoInterface = errors.New("no such interface")

// Attachment is what the filter holds for one workload host interface.
type Attachment struct {
	// Interface is the host interface (tap or veth host end).
	Interface string
	// Sources are the prefixes the workload may send from: its addresses
	// as host prefixes and its allowedSourcePrefixes.
	Sources []netip.Prefix
	// Gateways are the interface's gateway addresses, the only ones a
	// workload may ping.
	Gateways []netip.Addr
	// MAC is the container end's MAC of a veth; nil for a tap, whose
	// guest chooses its own.
	MAC net.HardwareAddr
	// Index is the interface's index when the caller has just looked the
	// interface up (ADD); 0 makes Add look it up by name.
	Index int
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	host := len(b)*8 - p.Bits()
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Cover returns ps without the prefixes another one contains, masked and
// sorted: an interval set refuses overlapping elements.
func Cover(ps []netip.Prefix) []netip.Prefix {
	var in []netip.Prefix
	for _, p := range ps {
		in = append(in, p.Masked())
	}
	slices.SortFunc(in, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []netip.Prefix
	for _, p := range in {
		if len(out) > 0 && out[len(out)-1].Overlaps(p) {
			continue // sorted by start then size: the earlier one contains p
		}
		out = append(out, p)
	}
	return out
}
