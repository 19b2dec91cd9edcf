package filter

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// galactic's nftables tables: what each attachment's elements are, reading
// and restoring the tables, and writing elements (write.go). The rules
// themselves are in rules.go.

// element is one set element: the set's name, its key and, for an interval
// set, the key's end.
type element struct {
	set      string
	key, end []byte
}

func (e element) id() string { return e.set + "/" + string(e.key) + "/" + string(e.end) }

func ifKey(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// elements are the set elements of a.
func (a Attachment) elements() []element {
	name := ifKey(a.Interface)
	var out []element
	// Host prefixes go to hash sets; only wider prefixes need an interval
	// set, whose updates cost more the more elements it holds.
	for _, p := range Cover(a.Sources) {
		key := append(slices.Clone(name), p.Addr().AsSlice()...)
		// IPv4 sources are also what the workload may claim in ARP.
		switch {
		case p.IsSingleIP() && p.Addr().Is4():
			out = append(out, element{set: setSrc4, key: key}, element{set: setARPSrc, key: key})
		case p.IsSingleIP():
			out = append(out, element{set: setSrc6, key: key})
		case p.Addr().Is4():
			end := append(slices.Clone(name), lastAddr(p).AsSlice()...)
			out = append(out, element{set: setNet4, key: key, end: end}, element{set: setARPNet, key: key, end: end})
		default:
			out = append(out, element{set: setNet6, key: key, end: append(slices.Clone(name), lastAddr(p).AsSlice()...)})
		}
	}
	seen := map[netip.Addr]bool{}
	for _, g := range a.Gateways {
		if seen[g] {
			continue
		}
		seen[g] = true
		set := setGw4
		if g.Is6() {
			set = setGw6
		}
		out = append(out, element{set: set, key: append(slices.Clone(name), g.AsSlice()...)})
	}
	if len(a.MAC) == 6 {
		key := append(append(slices.Clone(name), a.MAC...), 0, 0)
		out = append(out, element{set: setMAC, key: key}, element{set: setARPMAC, key: key})
	}
	return out
}

// describe names an element the way `nft list` would show it.
func (e element) describe() string {
	name := string(bytes.TrimRight(e.key[:min(len(e.key), unix.IFNAMSIZ)], "\x00"))
	rest := e.key[min(len(e.key), unix.IFNAMSIZ):]
	switch e.set {
	case setMAC, setARPMAC:
		return fmt.Sprintf("%s . %s", name, net.HardwareAddr(rest[:6]))
	case setVTEP4, setVTEP6:
		a, _ := netip.AddrFromSlice(e.key)
		return a.String()
	}
	a, _ := netip.AddrFromSlice(rest)
	if len(e.end) == 0 {
		return fmt.Sprintf("%s . %s", name, a)
	}
	b, _ := netip.AddrFromSlice(e.end[unix.IFNAMSIZ:])
	if a == b {
		return fmt.Sprintf("%s . %s", name, a)
	}
	return fmt.Sprintf("%s . %s-%s", name, a, b)
}

func (e element) iface() string {
	if e.set == setVTEP4 || e.set == setVTEP6 || len(e.key) < unix.IFNAMSIZ {
		return ""
	}
	return string(bytes.TrimRight(e.key[:unix.IFNAMSIZ], "\x00"))
}

func conn() (*nftables.Conn, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink: %w", err)
	}
	return c, nil
}

// ruleTag marks each rule with its place, so a changed or partial ruleset
// is told from galactic's own.
func ruleTag(chain string, i int) []byte { return fmt.Appendf(nil, "galactic:%s:%d:v5", chain, i) }

// Missing describes what of galactic's table, chains and rules the kernel
// lacks; empty when everything is in place.
func Missing() ([]string, error) {
	c, err := conn()
	if err != nil {
		return nil, err
	}
	return missing(c)
}

func missing(c *nftables.Conn) ([]string, error) {
	var out []string
	present := map[*nftables.Table]bool{}
	have := map[string]*nftables.Set{}
	for _, t := range tables {
		name := familyName(t) + " " + TableName
		if _, err := c.ListTableOfFamily(TableName, t.Family); err != nil {
			if errors.Is(err, unix.ENOENT) {
				out = append(out, "nftables table "+name+" is missing")
				continue
			}
			return nil, fmt.Errorf("reading nftables table %s: %w", name, err)
		}
		present[t] = true
		ss, err := c.GetSets(t)
		if err != nil {
			return nil, fmt.Errorf("listing the sets of %s: %w", name, err)
		}
		for _, s := range ss {
			have[s.Name] = s
		}
	}
	ss := sets()
	for _, name := range setOrder {
		want := ss[name]
		got, ok := have[name]
		switch {
		case !present[want.Table]:
		case !ok:
			out = append(out, fmt.Sprintf("set %s %s %s is missing", familyName(want.Table), TableName, name))
		case got.HasTimeout != want.HasTimeout || got.Interval != want.Interval:
			out = append(out, fmt.Sprintf("set %s %s %s has another definition than galactic's", familyName(want.Table), TableName, name))
		}
	}
	all := chains()
	foreign, err := foreignChains(c, all)
	if err != nil {
		return nil, err
	}
	for _, ch := range foreign {
		out = append(out, fmt.Sprintf("chain %s %s %s is not galactic's", familyName(ch.Table), TableName, ch.Name))
	}
	for _, cs := range all {
		if !present[cs.chain.Table] {
			continue
		}
		where := fmt.Sprintf("chain %s %s %s", familyName(cs.chain.Table), TableName, cs.chain.Name)
		rules, err := c.GetRules(cs.chain.Table, cs.chain)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				out = append(out, where+" is missing")
				continue
			}
			return nil, fmt.Errorf("listing %s: %w", where, err)
		}
		ok := len(rules) == len(cs.rules)
		for i := 0; ok && i < len(rules); i++ {
			ok = bytes.Equal(rules[i].UserData, ruleTag(cs.chain.Name, i))
		}
		if !ok {
			out = append(out, fmt.Sprintf("%s does not hold galactic's %d rules (has %d)", where, len(cs.rules), len(rules)))
		}
	}
	return out, nil
}

// foreignChains are the chains of galactic's tables that are not among
// want: an earlier ruleset's, or another agent's.
func foreignChains(c *nftables.Conn, want []chainSpec) ([]*nftables.Chain, error) {
	ours := map[string]bool{}
	for _, cs := range want {
		ours[familyName(cs.chain.Table)+" "+cs.chain.Name] = true
	}
	var out []*nftables.Chain
	for _, t := range tables {
		have, err := c.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return nil, fmt.Errorf("listing the chains of %s %s: %w", familyName(t), TableName, err)
		}
		for _, ch := range have {
			if ch.Table.Name == TableName && !ours[familyName(t)+" "+ch.Name] {
				out = append(out, ch)
			}
		}
	}
	return out, nil
}

func familyName(t *nftables.Table) string {
	if t.Family == nftables.TableFamilyARP {
		return "arp"
	}
	return "inet"
}

// ensure is Filter.Ensure on c. A ruleset of an earlier build that
// filtered in prerouting gets the classifier on its interfaces first
// (classifyFromSets), before the rebuild drops that chain.
func ensure(c *nftables.Conn) (bool, error) {
	miss, err := missing(c)
	if err != nil || len(miss) == 0 {
		return false, err
	}
	if hasPrerouting(c) {
		if err := classifyFromSets(c); err != nil {
			return false, fmt.Errorf("attaching the workload classifier before the rebuild drops the prerouting rules: %w", err)
		}
	}
	err = build(c)
	if err == nil {
		if miss, err = missing(c); err == nil && len(miss) > 0 {
			err = errors.New(strings.Join(miss, "; "))
		}
	}
	if err != nil {
		// A set of an older definition cannot be changed in place: start
		// the tables afresh; the callers put the elements back.
		delTables(c)
		if ferr := c.Flush(); ferr != nil && !errors.Is(ferr, unix.ENOENT) {
			return false, fmt.Errorf("creating nftables tables inet and arp %s: %w (and deleting them to start afresh: %v)", TableName, err, ferr)
		}
		if err := build(c); err != nil {
			return false, fmt.Errorf("creating nftables tables inet and arp %s: %w", TableName, err)
		}
	}
	return true, nil
}

// hasPrerouting says the inet table has a prerouting chain: an earlier
// build's ruleset, which filtered what workloads send there.
func hasPrerouting(c *nftables.Conn) bool {
	stale, err := foreignChains(c, chains())
	return err == nil && slices.ContainsFunc(stale, func(ch *nftables.Chain) bool {
		return ch.Table.Family == nftables.TableFamilyINet && ch.Name == "prerouting"
	})
}

// build writes the table, sets, chains and rules in one batch; the table's
// rules are flushed first, so concurrent builds leave one copy.
func build(c *nftables.Conn) error {
	for _, t := range tables {
		c.AddTable(t)
	}
	ss := sets()
	for _, name := range setOrder {
		if err := c.AddSet(ss[name], nil); err != nil {
			return err
		}
	}
	all := chains()
	for _, cs := range all {
		c.AddChain(cs.chain)
	}
	// Chains an earlier ruleset had go, base chains above all: an empty
	// hook still costs every packet it sees.
	stale, err := foreignChains(c, all)
	if err != nil {
		return err
	}
	for _, t := range tables {
		c.FlushTable(t)
	}
	for _, ch := range stale {
		c.DelChain(ch)
	}
	for _, cs := range all {
		for i, exprs := range cs.rules {
			c.AddRule(&nftables.Rule{Table: cs.chain.Table, Chain: cs.chain, Exprs: exprs, UserData: ruleTag(cs.chain.Name, i)})
		}
	}
	return c.Flush()
}

// delTables deletes both tables in one batch, on c's next Flush. A
// table that is missing makes the kernel refuse the batch: delete only
// the present ones.
func delTables(c *nftables.Conn) {
	for _, t := range tables {
		if _, err := c.ListTableOfFamily(TableName, t.Family); err == nil {
			c.DelTable(t)
		}
	}
}

// listElements returns the elements of the named sets, without those
// being removed (an expiration set by a removal, not yet reached).
func listElements(c *nftables.Conn, names ...string) ([]element, error) {
	var out []element
	for _, name := range names {
		s := sets()[name]
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("listing set %s %s %s: %w", familyName(s.Table), TableName, name, err)
		}
		for _, e := range elems {
			if e.IntervalEnd || (s.HasTimeout && e.Expires < goneAfter) {
				continue
			}
			el := element{set: name, key: e.Key}
			if s.Interval {
				el.end = e.KeyEnd
			}
			out = append(out, el)
		}
	}
	return out, nil
}

var attachmentSets = []string{setSrc4, setSrc6, setNet4, setNet6, setGw4, setGw6, setMAC, setARPSrc, setARPNet, setARPMAC}

func toSetElements(es []element) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	for _, e := range es {
		out[e.set] = append(out[e.set], nftables.SetElement{Key: e.key, KeyEnd: e.end})
	}
	return out
}

// apply adds and deletes VTEP elements in one batch. Attachment elements
// go through writeElements.
func apply(c *nftables.Conn, add, del []element) error {
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	ss := sets()
	for name, es := range toSetElements(del) {
		if err := c.SetDeleteElements(ss[name], es); err != nil {
			return err
		}
	}
	for name, es := range toSetElements(add) {
		if err := c.SetAddElements(ss[name], es); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("updating the sets of nftables table %s: %w", TableName, err)
	}
	return nil
}

// addElements restores the tables if they are gone (reporting whether it
// rebuilt them) and writes a's elements, removing previous' that a has not.
func addElements(c *nftables.Conn, a Attachment, previous []Attachment) (rebuilt bool, err error) {
	if rebuilt, err = ensureQuick(c); err != nil {
		return rebuilt, err
	}
	want := a.elements()
	var stale []element
	for _, p := range previous {
		stale = append(stale, p.elements()...)
	}
	_, del := diff(stale, want, func(e element) bool { return e.iface() == a.Interface })
	err = remove(want, dedupe(del))
	if errors.Is(err, unix.ENOENT) {
		// A table or set of an older galactic, or flushed since the check.
		again, err := ensure(c)
		if err != nil {
			return rebuilt, err
		}
		rebuilt = rebuilt || again
		err = remove(want, dedupe(del))
	}
	if err == nil || errors.Is(err, unix.ENOENT) {
		return rebuilt, err
	}
	// The kernel refused an interval overlapping one the sets hold (a new
	// prefix inside a removed one, or records and sets diverged): replace
	// every element of the interface from what the sets hold, deleting
	// the intervals outright.
	have, err := listElements(c, attachmentSets...)
	if err != nil {
		return rebuilt, err
	}
	_, del = diff(have, want, func(e element) bool { return e.iface() == a.Interface })
	expire, intervals := splitIntervals(del)
	return rebuilt, writeElements(want, expire, intervals)
}

// splitIntervals separates interval elements from the others.
func splitIntervals(es []element) (others, intervals []element) {
	for _, e := range es {
		if len(e.end) > 0 {
			intervals = append(intervals, e)
		} else {
			others = append(others, e)
		}
	}
	return others, intervals
}

func dedupe(es []element) []element {
	seen := map[string]bool{}
	var out []element
	for _, e := range es {
		if !seen[e.id()] {
			seen[e.id()] = true
			out = append(out, e)
		}
	}
	return out
}

// ensureQuick restores the table when it or its input rules are gone
// (a flush): it counts the input chain's rules, the cheapest read that
// tells a flushed table, instead of Ensure's full comparison, which CHECK,
// the GC and the router make.
func ensureQuick(c *nftables.Conn) (bool, error) {
	for _, cs := range chains() {
		if cs.chain.Name != "input" {
			continue
		}
		if n, err := countRules(cs.chain); err == nil && n == len(cs.rules) {
			return false, nil
		}
	}
	return ensure(c)
}

// diff returns what to add and delete so that the elements of have for
// which mine holds become want.
func diff(have, want []element, mine func(element) bool) (add, del []element) {
	wantIDs := map[string]bool{}
	for _, e := range want {
		wantIDs[e.id()] = true
	}
	haveIDs := map[string]bool{}
	for _, e := range have {
		if !mine(e) {
			continue
		}
		haveIDs[e.id()] = true
		if !wantIDs[e.id()] {
			del = append(del, e)
		}
	}
	for _, e := range want {
		if !haveIDs[e.id()] {
			add = append(add, e)
			haveIDs[e.id()] = true
		}
	}
	return add, del
}

// removeElements removes the interface's elements: known's when the
// kernel takes that, otherwise whatever the sets hold for it.
func removeElements(iface string, known []Attachment) error {
	var exact []element
	for _, k := range known {
		if k.Interface == iface {
			exact = append(exact, k.elements()...)
		}
	}
	if len(exact) > 0 {
		err := remove(nil, dedupe(exact))
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil // ENOENT: no table, or no set: nothing to remove
		}
	}
	c, err := conn()
	if err != nil {
		return err
	}
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); errors.Is(err, unix.ENOENT) {
		return nil
	}
	have, err := listElements(c, attachmentSets...)
	if err != nil {
		return err
	}
	_, del := diff(have, nil, func(e element) bool { return e.iface() == iface })
	return remove(nil, del)
}

// Elements counts the elements of every set of the tables; a missing
// table counts none.
func Elements() (int, error) {
	c, err := conn()
	if err != nil {
		return 0, err
	}
	var names []string
	for _, t := range tables {
		if _, err := c.ListTableOfFamily(TableName, t.Family); errors.Is(err, unix.ENOENT) {
			continue
		}
		for _, name := range setOrder {
			if sets()[name].Table == t {
				names = append(names, name)
			}
		}
	}
	es, err := listElements(c, names...)
	return len(es), err
}

// checkElements describes how the sets' elements of a's interface differ
// from a's.
func checkElements(c *nftables.Conn, a Attachment) ([]string, error) {
	have, err := listElements(c, attachmentSets...)
	if err != nil {
		return nil, err
	}
	add, del := diff(have, a.elements(), func(e element) bool { return e.iface() == a.Interface })
	var miss []string
	for _, e := range add {
		miss = append(miss, fmt.Sprintf("set %s %s %s lacks %s", familyName(sets()[e.set].Table), TableName, e.set, e.describe()))
	}
	for _, e := range del {
		miss = append(miss, fmt.Sprintf("set %s %s %s has %s, which the attachment does not allow", familyName(sets()[e.set].Table), TableName, e.set, e.describe()))
	}
	return miss, nil
}

// writeAttachmentElements adds add and removes del, attachment elements,
// in one batch; when the kernel refuses an interval overlapping one being
// removed, it deletes those outright.
func writeAttachmentElements(add, del []element) error {
	if err := remove(add, del); err == nil || errors.Is(err, unix.ENOENT) {
		return err
	}
	expire, intervals := splitIntervals(del)
	return writeElements(add, expire, intervals)
}

func vtepElement(v netip.Addr) element {
	v = v.Unmap()
	if v.Is6() {
		return element{set: setVTEP6, key: v.AsSlice()}
	}
	return element{set: setVTEP4, key: v.AsSlice()}
}

// deleteTables deletes both tables; a missing one is not an error.
func deleteTables(c *nftables.Conn) error {
	for _, t := range tables {
		c.DelTable(t)
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("deleting nftables table %s %s: %w", familyName(t), TableName, err)
		}
	}
	return nil
}
