package filter

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The workload classifier (bpf/classifier.c): one tc program per network
// namespace, attached to the ingress of every workload host interface,
// that looks the interface's attachment up in a hash map keyed by ifindex
// and lets through only what the attachment may send. ADD and DEL write
// and delete one map entry, so nothing is verified per attachment.
//
// A map value (the attachment, struct attachment in the C source),
// little-endian where it is a number:
//
//	0    u32 flags (flagMAC: the frames' source MAC must be the one at 8)
//	4    u8  IPv4 source prefixes, 5: u8 IPv6 source prefixes
//	8    6 bytes MAC
//	16   maxSources × {addr [4]byte, mask [4]byte}
//	144  maxSources × {addr [16]byte, mask [16]byte}
const (
	maxSources = MaxSources
	flagMAC    = 1
	valFlags   = 0
	valN4      = 4
	valN6      = 5
	valMAC     = 8
	valV4      = 16
	valV6      = valV4 + maxSources*8
	valueSize  = valV6 + maxSources*32
)

// MaxSources is how many source prefixes of each family an attachment
// may have, after merging those another contains.
const MaxSources = 16

// Validate says whether the classifier can hold a.
func (a Attachment) Validate() error {
	_, err := a.value()
	return err
}

// sourceFamily is where a map value keeps one family's prefixes: the
// count's offset, the first entry's, and the address size (an entry is
// the address, then its mask).
type sourceFamily struct {
	name        string
	count, base int
	size        int
}

var sourceFamilies = [2]sourceFamily{{"IPv4", valN4, valV4, 4}, {"IPv6", valN6, valV6, 16}}

func familyOf(a netip.Addr) sourceFamily {
	if a.Is4() {
		return sourceFamilies[0]
	}
	return sourceFamilies[1]
}

// value is a's map value.
func (a Attachment) value() ([]byte, error) {
	v := make([]byte, valueSize)
	if len(a.MAC) == 6 {
		binary.LittleEndian.PutUint32(v[valFlags:], flagMAC)
		copy(v[valMAC:], a.MAC)
	}
	for _, p := range Cover(a.Sources) {
		f := familyOf(p.Addr())
		n := int(v[f.count])
		if n == maxSources {
			return nil, fmt.Errorf("more than %d %s source prefixes (after merging those another contains)", maxSources, f.name)
		}
		off := f.base + 2*f.size*n
		copy(v[off:], p.Addr().AsSlice())
		copy(v[off+f.size:], net.CIDRMask(p.Bits(), 8*f.size))
		v[f.count]++
	}
	return v, nil
}

// describeValue names what a map value allows, for CHECK's messages.
func describeValue(v []byte) string {
	if len(v) != valueSize {
		return fmt.Sprintf("%d bytes", len(v))
	}
	var out []netip.Prefix
	for _, f := range sourceFamilies {
		for i := range int(v[f.count]) {
			off := f.base + 2*f.size*i
			a, _ := netip.AddrFromSlice(v[off : off+f.size])
			ones, _ := net.IPMask(v[off+f.size : off+2*f.size]).Size()
			out = append(out, netip.PrefixFrom(a, ones))
		}
	}
	s := fmt.Sprint(out)
	if binary.LittleEndian.Uint32(v[valFlags:])&flagMAC != 0 {
		s += " mac " + net.HardwareAddr(v[valMAC:valMAC+6]).String()
	}
	return s
}

// filterName names galactic's tc filter on a workload interface's ingress.
const filterName = "galactic"

// progName is the program's name: its object's hash, so that a program of
// another build is told from this one's and replaced. The hash is a
// generated constant (a test recomputes it) because hashing costs a
// plugin process more than the rest of its ADD's classifier work, and
// short of the kernel's 15 characters, which readers take for a
// truncated name.
func progName() string { return "galactic_" + codeHash }

func hashCode() string {
	h := sha256.Sum256(_ClassifierBytes)
	return hex.EncodeToString(h[:])[:len(codeHash)]
}

// mapName names a namespace's attachments map by the namespace's inode:
// programs are global, interface indexes are per namespace.
func mapName(netns uint64) string { return fmt.Sprintf("gw%d", netns) }

func currentNetns() (uint64, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, fmt.Errorf("reading the network namespace: %w", err)
	}
	return st.Ino, nil
}

// classifier is the namespace's program and its attachments map.
type classifier struct {
	prog *ebpf.Program
	id   ebpf.ProgramID
	vals *ebpf.Map
}

var (
	classifiersMu sync.Mutex
	// By namespace: a long-lived process (the GC, the router) keeps its
	// namespace's program open, so it is found once.
	classifiers = map[uint64]*classifier{}
)

// current returns the namespace's classifier of this build: the one
// already loaded (found among the kernel's programs by name) or a new one.
func current() (*classifier, error) {
	ns, err := currentNetns()
	if err != nil {
		return nil, err
	}
	return currentIn(ns)
}

// currentIn is current for namespace ns, from any thread.
func currentIn(ns uint64) (*classifier, error) {
	classifiersMu.Lock()
	defer classifiersMu.Unlock()
	if c := classifiers[ns]; c != nil {
		return c, nil
	}
	c, err := find(ns)
	if err == nil && c == nil {
		c, err = load(ns)
	}
	if err != nil {
		return nil, err
	}
	classifiers[ns] = c
	return c, nil
}

// find looks for a program of this build with the namespace's map.
func find(ns uint64) (*classifier, error) {
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, nil
			}
			return nil, fmt.Errorf("listing BPF programs: %w", err)
		}
		id = next
		if c := open(id, ns); c != nil {
			return c, nil
		}
	}
}

// open returns program id as a classifier when it is this build's and
// holds the namespace's map.
func open(id ebpf.ProgramID, ns uint64) *classifier {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return nil // gone since it was listed
	}
	if name, ids, err := progNameAndMaps(p); err == nil && name == progName() && len(ids) == 1 {
		if m, err := ebpf.NewMapFromID(ids[0]); err == nil {
			if name, err := mapObjName(m); err == nil && name == mapName(ns) {
				return &classifier{prog: p, id: id, vals: m}
			}
			m.Close()
		}
	}
	p.Close()
	return nil
}

func (c *classifier) close() {
	c.prog.Close()
	c.vals.Close()
}

func load(ns uint64) (*classifier, error) {
	objs, err := loadClassifierNamed(mapName(ns))
	if err != nil {
		return nil, err
	}
	info, err := objs.Classify.Info()
	if err != nil {
		objs.Close()
		return nil, err
	}
	id, _ := info.ID()
	return &classifier{prog: objs.Classify, id: id, vals: objs.Attachments}, nil
}

// loadClassifierNamed loads the classifier with its map named mapName.
func loadClassifierNamed(mapName string) (*classifierObjects, error) {
	spec, err := loadClassifier()
	if err != nil {
		return nil, err
	}
	spec.Maps[classifierMapAttachments].Name = mapName
	spec.Programs[classifierProgClassify].Name = progName()
	var objs classifierObjects
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogDisabled: true}}); err != nil {
		return nil, fmt.Errorf("loading the workload classifier (the kernel needs BPF hash maps and cls_bpf): %w", err)
	}
	return &objs, nil
}

func ifKeyIndex(idx int) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(idx)) }

// attached returns the galactic filter on link's ingress, nil if none.
func attached(link netlink.Link) (*netlink.BpfFilter, error) {
	return ingressFilter(link, func(name string) bool { return strings.HasPrefix(name, filterName) })
}

// ingressFilter returns the BPF filter on link's ingress whose name
// matches, nil if none.
func ingressFilter(link netlink.Link, match func(string) bool) (*netlink.BpfFilter, error) {
	fs, err := netlink.FilterList(link, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil // no clsact qdisc
		}
		return nil, fmt.Errorf("listing the tc filters of %s: %w", link.Attrs().Name, err)
	}
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok && match(bf.Name) {
			return bf, nil
		}
	}
	return nil, nil
}

// addClsact gives link the clsact qdisc that ingress filters hang from,
// if it has none.
func addClsact(h *netlink.Handle, link netlink.Link) error {
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding the clsact qdisc to %s (the kernel needs sch_ingress): %w", link.Attrs().Name, err)
	}
	return nil
}

// attach puts c on link's ingress, replacing galactic's filter in place.
// An ADD's interface (fresh) has no clsact qdisc yet, so it gets one
// first; any other interface gets one only when the filter finds none.
func (c *classifier) attach(h *netlink.Handle, link netlink.Link, fresh bool) error {
	idx := link.Attrs().Index
	if fresh {
		if err := addClsact(h, link); err != nil {
			return err
		}
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.HANDLE_MIN_INGRESS, Handle: netlink.MakeHandle(0, 1), Protocol: unix.ETH_P_ALL, Priority: 1},
		Fd:          c.prog.FD(), Name: filterName, DirectAction: true,
	}
	err := h.FilterReplace(f)
	if !fresh && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT)) {
		if err := addClsact(h, link); err != nil {
			return err
		}
		err = h.FilterReplace(f)
	}
	if err != nil {
		return fmt.Errorf("attaching the workload classifier to %s (the kernel needs cls_bpf): %w", link.Attrs().Name, err)
	}
	return nil
}

// put writes a's entry and attaches the classifier to its interface,
// entry first, so that no packet meets the program without it. Unless
// always (an ADD, whose interface is new), it attaches only when the
// interface has no filter of c. h's sockets say the namespace.
func (c *classifier) put(h *netlink.Handle, link netlink.Link, a Attachment, always bool) (attachedNow bool, err error) {
	v, err := a.value()
	if err != nil {
		return false, err
	}
	if err := c.vals.Put(ifKeyIndex(link.Attrs().Index), v); err != nil {
		return false, fmt.Errorf("writing %s's entry in the workload classifier's map: %w", a.Interface, err)
	}
	if !always {
		f, err := attached(link)
		if err != nil {
			return false, err
		}
		if f != nil && f.Id == int(c.id) {
			return false, nil
		}
	}
	return true, c.attach(h, link, always)
}

func linkByName(name string) (netlink.Link, error) { return linkVia(&netlink.Handle{}, name) }

// linkVia looks name up in the namespace of h's sockets.
func linkVia(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return nil, fmt.Errorf("%s: %w", name, ErrNoInterface)
		}
		return nil, fmt.Errorf("looking up %s: %w", name, err)
	}
	return l, nil
}

// classify writes a's entry and attaches c to a's interface in the
// namespace of h's sockets, from any thread.
func (c *classifier) classify(h *netlink.Handle, a Attachment) error {
	var link netlink.Link = &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: a.Interface, Index: a.Index}}
	if a.Index == 0 {
		var err error
		if link, err = linkVia(h, a.Interface); err != nil {
			return err
		}
	}
	_, err := c.put(h, link, a, true)
	return err
}

// unclassify deletes the interface's entry from the map of the program
// attached to it, this build's or another's; a missing interface or
// filter leaves nothing to delete (the filter goes with the interface;
// the GC prunes the entry). It never loads a program.
func unclassify(iface string) error {
	link, err := linkByName(iface)
	if errors.Is(err, ErrNoInterface) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := attached(link)
	if err != nil || f == nil {
		return err
	}
	key := ifKeyIndex(link.Attrs().Index)
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(f.Id))
	if err != nil {
		return nil
	}
	defer p.Close()
	_, ids, err := progNameAndMaps(p)
	if err != nil {
		return nil
	}
	for _, id := range ids {
		if m, err := ebpf.NewMapFromID(id); err == nil {
			err = ignoreMissing(m.Delete(key))
			m.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func ignoreMissing(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// checkClassifier describes what of a's classifier the kernel lacks.
func checkClassifier(a Attachment) []string {
	link, err := linkByName(a.Interface)
	if err != nil {
		return []string{err.Error()}
	}
	f, err := attached(link)
	if err != nil {
		return []string{err.Error()}
	}
	if f == nil {
		return []string{a.Interface + " has no workload classifier on its ingress"}
	}
	ns, err := currentNetns()
	if err != nil {
		return []string{err.Error()}
	}
	// The attached program itself: CHECK changes nothing, so it does not
	// load this build's when the node has none.
	c := open(ebpf.ProgramID(f.Id), ns)
	if c == nil {
		return []string{fmt.Sprintf("the classifier on %s is not galactic's current one (%s)", a.Interface, progName())}
	}
	defer c.close()
	want, err := a.value()
	if err != nil {
		return []string{err.Error()}
	}
	have := make([]byte, valueSize)
	if err := c.vals.Lookup(ifKeyIndex(link.Attrs().Index), &have); err != nil {
		return []string{fmt.Sprintf("the workload classifier's map has no entry for %s", a.Interface)}
	}
	if string(have) != string(want) {
		return []string{fmt.Sprintf("the workload classifier's entry for %s allows %s, the attachment %s", a.Interface, describeValue(have), describeValue(want))}
	}
	return nil
}

// attachAll writes the entry of each interface atts name (attachments
// sharing an interface add up) and attaches c where it is missing.
// Missing interfaces are skipped. It returns the indexes it wrote and how
// many filters it attached.
func (c *classifier) attachAll(atts []Attachment) (map[uint32]bool, int, error) {
	byIf := map[string]*Attachment{}
	var order []string
	for _, a := range atts {
		u := byIf[a.Interface]
		if u == nil {
			u = &Attachment{Interface: a.Interface}
			byIf[a.Interface] = u
			order = append(order, a.Interface)
		}
		u.Sources = append(u.Sources, a.Sources...)
		if u.MAC == nil {
			u.MAC = a.MAC
		}
	}
	written := map[uint32]bool{}
	n := 0
	var errs []error
	for _, name := range order {
		link, err := linkByName(name)
		if errors.Is(err, ErrNoInterface) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		written[uint32(link.Attrs().Index)] = true
		now, err := c.put(&netlink.Handle{}, link, *byIf[name], false)
		if err != nil {
			errs = append(errs, err)
		}
		if now {
			n++
		}
	}
	return written, n, errors.Join(errs...)
}

// syncClassifiers makes the namespace's map hold exactly atts' entries
// and attaches the classifier to each of their interfaces that lacks it
// (attachAll). It returns how many filters it attached.
func syncClassifiers(atts []Attachment) (int, error) {
	c, err := current()
	if err != nil {
		return 0, err
	}
	keep, n, err := c.attachAll(atts)
	errs := []error{err}
	if err := pruneMap(c.vals, valueSize, func(k, _ []byte) bool { return keep[binary.LittleEndian.Uint32(k)] }); err != nil {
		errs = append(errs, fmt.Errorf("pruning the workload classifier's map: %w", err))
	}
	return n, errors.Join(errs...)
}

// detachAll removes galactic's filter from every workload interface.
func detachAll() error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("listing interfaces: %w", err)
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if !strings.HasPrefix(name, tapPrefix) && !strings.HasPrefix(name, vethPrefix) {
			continue
		}
		f, err := attached(l)
		if err != nil || f == nil {
			continue
		}
		if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("detaching the workload classifier from %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// classifyFromSets attaches the classifier to every interface the source
// sets hold elements of and that has no classifier of this build yet: a
// ruleset of a build that filtered in prerouting is about to be rebuilt
// without it, and its sets say what each interface may send.
func classifyFromSets(c *nftables.Conn) error {
	have, err := listElements(c, setSrc4, setSrc6, setNet4, setNet6, setMAC)
	if err != nil {
		return err
	}
	// One fragment per element; attachAll adds up an interface's.
	var atts []Attachment
	for _, e := range have {
		a := Attachment{Interface: e.iface()}
		rest := e.key[unix.IFNAMSIZ:]
		if e.set == setMAC {
			a.MAC = net.HardwareAddr(slices.Clone(rest[:6]))
			atts = append(atts, a)
			continue
		}
		start, _ := netip.AddrFromSlice(rest)
		bits := start.BitLen()
		if len(e.end) > 0 {
			end, _ := netip.AddrFromSlice(e.end[unix.IFNAMSIZ:])
			for bits > 0 && lastAddr(netip.PrefixFrom(start, bits)) != end {
				bits--
			}
		}
		a.Sources = []netip.Prefix{netip.PrefixFrom(start, bits)}
		atts = append(atts, a)
	}
	cl, err := current()
	if err != nil {
		return err
	}
	_, _, err = cl.attachAll(atts)
	return err
}
