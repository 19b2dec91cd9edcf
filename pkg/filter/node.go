package filter

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// New returns the kernel's packet filter: galactic's nftables tables
// (tables.go, rules.go, write.go) and its two tc programs with their maps
// (classifier.go, decap.go), kept in step by the operations below. Every
// Filter New returns shares the process's programs, which are per network
// namespace: a long-lived daemon finds its namespace's once.
func New() Filter { return kernel{} }

type kernel struct{}

func (k kernel) Add(a Attachment, previous ...Attachment) error {
	return k.StartAdd(a, previous...).Finish(a.Index)
}

// adding is the kernel's Adding.
type adding struct {
	a   Attachment
	err error // StartAdd's own, before anything began

	rebuilt  bool
	elements func() error
	found    <-chan found
	// attached is nil until Attach begins.
	attached func() found
}

// found is the namespace's classifier, or why there is none.
type found struct {
	c   *classifier
	err error
}

// StartAdd begins in the namespace of the calling thread, which the
// caller may leave meanwhile. Finish or Wait must follow.
func (kernel) StartAdd(a Attachment, previous ...Attachment) Adding {
	p := &adding{a: a}
	ns, err := currentNetns()
	if err != nil {
		p.err = err
		return p
	}
	ch := make(chan found, 1)
	go func() {
		c, err := currentIn(ns)
		ch <- found{c, err}
	}()
	p.found = ch
	done := goHere(func() error {
		c, err := conn()
		if err != nil {
			return err
		}
		p.rebuilt, err = addElements(c, a, previous)
		return err
	})
	p.elements = sync.OnceValue(func() error { return <-done })
	return p
}

func (p *adding) Attach(index int) {
	if p.err != nil || p.attached != nil {
		return
	}
	p.a.Index = index
	a := p.a
	ch := make(chan found, 1)
	p.attached = sync.OnceValue(func() found { return <-ch })
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		ch <- found{err: fmt.Errorf("opening rtnetlink: %w", err)}
		return
	}
	go func() {
		defer h.Close()
		f := <-p.found
		if f.err == nil {
			f.err = f.c.classify(h, a)
		}
		ch <- f
	}()
}

func (p *adding) Finish(index int) error {
	if p.err != nil {
		return p.err
	}
	p.Attach(index)
	werr := p.Wait()
	at := p.attached()
	if at.err != nil {
		return at.err
	}
	if werr != nil || !p.rebuilt {
		return werr
	}
	// A rebuild from an earlier build's ruleset writes the classifier
	// entries from the sets, which may hold a's previous sources.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening rtnetlink: %w", err)
	}
	defer h.Close()
	return at.c.classify(h, p.a)
}

func (p *adding) Wait() error {
	if p.err != nil {
		return p.err
	}
	err := p.elements()
	if p.attached != nil {
		p.attached()
	}
	return err
}

func (kernel) Remove(iface string, known ...Attachment) error {
	// The elements go on a thread of their own while the classifier's
	// entry goes here, as Add writes them.
	removed := kernel{}.StartRemove(iface, known...)
	uerr := unclassify(iface)
	if err := removed(); uerr == nil {
		return err
	}
	return uerr
}

// StartRemove works in the namespace of the calling thread, which the
// caller may leave meanwhile.
func (kernel) StartRemove(iface string, known ...Attachment) (wait func() error) {
	done := goHere(func() error { return removeElements(iface, known) })
	return func() error { return <-done }
}

func (kernel) Check(a Attachment) error {
	c, err := conn()
	if err != nil {
		return err
	}
	miss, err := missing(c)
	if err != nil {
		return err
	}
	if len(miss) == 0 {
		miss, err = checkElements(c, a)
		if err != nil {
			return err
		}
	}
	miss = append(miss, checkClassifier(a)...)
	if len(miss) > 0 {
		return errors.New(strings.Join(miss, "; "))
	}
	return nil
}

// reconcile is what Sync and SetVTEPs share: it restores the tables,
// reads the named sets and returns what makes them want, counted.
func reconcile(sets []string, want []element) (c *nftables.Conn, res SyncResult, add, del []element, err error) {
	if c, err = conn(); err != nil {
		return
	}
	if res.Rebuilt, err = ensure(c); err != nil {
		return
	}
	have, err := listElements(c, sets...)
	if err != nil {
		return
	}
	add, del = diff(have, want, func(element) bool { return true })
	res.Added, res.Removed = len(add), len(del)
	return
}

func (kernel) Sync(atts []Attachment) (SyncResult, error) {
	var want []element
	for _, a := range atts {
		want = append(want, a.elements()...)
	}
	_, res, add, del, err := reconcile(attachmentSets, want)
	if err != nil {
		return res, err
	}
	if res.Attached, err = syncClassifiers(atts); err != nil {
		return res, err
	}
	return res, writeAttachmentElements(add, del)
}

func (kernel) SetVTEPs(vteps []netip.Addr) (SyncResult, error) {
	var want []element
	for _, v := range vteps {
		want = append(want, vtepElement(v))
	}
	c, res, add, del, err := reconcile([]string{setVTEP4, setVTEP6}, want)
	if err != nil {
		return res, err
	}
	if err := apply(c, add, del); err != nil {
		return res, err
	}
	// The sets first: the fast path takes no VTEP the rules do not.
	return res, syncDecap(vteps)
}

func (kernel) Ensure() (bool, error) {
	c, err := conn()
	if err != nil {
		return false, err
	}
	return ensure(c)
}

func (kernel) Delete() error {
	if err := detachAll(); err != nil {
		return err
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("listing interfaces: %w", err)
	}
	if err := detachDecap(links, nil); err != nil {
		return err
	}
	c, err := conn()
	if err != nil {
		return err
	}
	return deleteTables(c)
}
