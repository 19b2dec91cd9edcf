package filter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Attachment elements are never deleted: they carry a timeout, and removing
// one sets its expiration to now, after which lookups and listings skip it
// and the kernel's set GC frees it. A deletion would leave a transaction
// that the kernel frees only after an RCU grace period, and closing any
// nftables netlink socket (every plugin process exits) waits for that
// grace period: 10–30 ms on a loaded node, on every DEL and on the next
// ADD. An expiration update is freed at once.
const (
	// elementLife is every attachment element's timeout: long enough that
	// no node outlives it (the kernel caps timeouts at ~580 years).
	elementLife = 100 * 365 * 24 * time.Hour
	// expireSoon is the expiration a removal sets. Zero is refused.
	expireSoon = time.Millisecond
	// goneAfter: a listed element closer than this to its end is one being
	// removed, not an attachment's.
	goneAfter = time.Hour
)

// Netlink attributes of an element write.
const (
	attrListTable    = unix.NFTA_SET_ELEM_LIST_TABLE
	attrListSet      = unix.NFTA_SET_ELEM_LIST_SET
	attrListElements = unix.NFTA_SET_ELEM_LIST_ELEMENTS
	attrElemKey      = unix.NFTA_SET_ELEM_KEY
	attrElemKeyEnd   = nftables.NFTA_SET_ELEM_KEY_END
	attrElemTimeout  = unix.NFTA_SET_ELEM_TIMEOUT
	attrElemExpires  = unix.NFTA_SET_ELEM_EXPIRATION
	attrDataValue    = unix.NFTA_DATA_VALUE
)

func u64ms(d time.Duration) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(d.Milliseconds()))
}

func nested(t uint16) uint16 { return t | unix.NLA_F_NESTED }

// elemAttrs encodes one element with the expiration it is given; a zero
// expiration encodes the key alone, for a deletion.
func elemAttrs(e element, expires time.Duration) ([]byte, error) {
	key, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: attrDataValue, Data: e.key}})
	if err != nil {
		return nil, err
	}
	attrs := []netlink.Attribute{{Type: nested(attrElemKey), Data: key}}
	if len(e.end) > 0 {
		end, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: attrDataValue, Data: e.end}})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, netlink.Attribute{Type: nested(attrElemKeyEnd), Data: end})
	}
	if expires == 0 {
		return netlink.MarshalAttributes(attrs)
	}
	attrs = append(attrs,
		netlink.Attribute{Type: attrElemTimeout, Data: u64ms(elementLife)},
		netlink.Attribute{Type: attrElemExpires, Data: u64ms(expires)})
	return netlink.MarshalAttributes(attrs)
}

func nfgen(family uint8, resID uint16) []byte {
	return binary.BigEndian.AppendUint16([]byte{family, unix.NFNETLINK_V0}, resID)
}

// A batch must fit the socket's send buffer (wmem_default, 208 KiB on
// most kernels), and a message's element list one attribute, whose length
// is 16 bits: at most ~100 bytes an element, 300 elements stay below it.
const (
	maxBatch       = 128 << 10
	maxMessageElem = 300
)

// writeElements adds add (or renews them: an element being removed comes
// back), expires expire and deletes del, all attachment-set elements, in
// one batch (several when they do not fit one, which only a GC pass
// writes). Adds and expiries are NEWSETELEM without NLM_F_EXCL: on an
// element that exists the kernel updates its expiration, so both are
// idempotent. del is for interval elements a new one overlaps, which an
// expiring element still blocks until it expires.
func writeElements(add, expire, del []element) error {
	type op struct {
		e       element
		expires time.Duration // 0: delete
	}
	var ops []op
	for _, e := range del {
		ops = append(ops, op{e, 0})
	}
	for _, e := range expire {
		ops = append(ops, op{e, expireSoon})
	}
	for _, e := range add {
		ops = append(ops, op{e, elementLife})
	}
	// Deletions first, so an add may reuse what they free; then by set, so
	// a batch has few messages (each is acked).
	slices.SortStableFunc(ops, func(a, b op) int {
		if (a.expires == 0) != (b.expires == 0) {
			if a.expires == 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(a.e.set, b.e.set)
	})
	for len(ops) > 0 {
		var msgs []netlink.Message
		size := 0
		for len(ops) > 0 && (len(msgs) == 0 || size < maxBatch) {
			// One message per run of operations on the same set and verb.
			n := 1
			for n < len(ops) && n < maxMessageElem && ops[n].e.set == ops[0].e.set && (ops[n].expires == 0) == (ops[0].expires == 0) {
				n++
			}
			m, err := elementMessage(sets()[ops[0].e.set].Table, ops[0].e.set, ops[0].expires == 0, func(yield func(element, time.Duration) bool) {
				for _, o := range ops[:n] {
					if !yield(o.e, o.expires) {
						return
					}
				}
			})
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
			size += len(m.Data)
			ops = ops[n:]
		}
		// EBUSY: a hash set refuses a key whose bucket already holds many
		// expired copies (one per removal and re-add of the same element
		// since the kernel's set GC last ran, about every second); the GC
		// frees them, so wait for it rather than fail.
		err := sendBatch(msgs)
		for wait, waited := time.Millisecond, time.Duration(0); errors.Is(err, unix.EBUSY) && waited < 3*time.Second; wait = min(2*wait, 500*time.Millisecond) {
			time.Sleep(wait)
			waited += wait
			err = sendBatch(msgs)
		}
		if err != nil {
			return fmt.Errorf("updating the sets of nftables tables %s: %w", TableName, err)
		}
	}
	return nil
}

// elementMessage is one NEWSETELEM (DELSETELEM when del) of a set.
func elementMessage(t *nftables.Table, set string, del bool, elems func(func(element, time.Duration) bool)) (netlink.Message, error) {
	var list []netlink.Attribute
	var err error
	for e, expires := range elems {
		var b []byte
		if b, err = elemAttrs(e, expires); err != nil {
			return netlink.Message{}, err
		}
		list = append(list, netlink.Attribute{Type: nested(uint16(len(list) + 1)), Data: b})
	}
	encoded, err := netlink.MarshalAttributes(list)
	if err != nil {
		return netlink.Message{}, err
	}
	body, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: attrListTable, Data: []byte(TableName + "\x00")},
		{Type: attrListSet, Data: []byte(set + "\x00")},
		{Type: nested(attrListElements), Data: encoded},
	})
	if err != nil {
		return netlink.Message{}, err
	}
	verb, flags := unix.NFT_MSG_NEWSETELEM, netlink.Request|netlink.Acknowledge|netlink.Create
	if del {
		verb, flags = unix.NFT_MSG_DELSETELEM, netlink.Request|netlink.Acknowledge
	}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | verb), Flags: flags},
		Data:   append(nfgen(uint8(t.Family), 0), body...),
	}, nil
}

// sendBatch sends msgs between batch markers and waits for the kernel's
// answer to them.
func sendBatch(msgs []netlink.Message) error {
	marker := func(t int) netlink.Message {
		return netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(t), Flags: netlink.Request},
			Data:   nfgen(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
		}
	}
	c, err := openNF()
	if err != nil {
		return err
	}
	defer c.close()
	// Acks without the request echoed: a large batch's would overflow the
	// receive buffer.
	if err := c.setOption(unix.NETLINK_CAP_ACK); err != nil {
		return err
	}
	// Only the last message asks for an ack. The kernel reports a failing
	// message's error whatever its flags and delivers the batch's replies
	// together once it has applied or aborted it, so the last message's
	// reply ends the batch, and an error before it is the answer.
	batch := []netlink.Message{marker(unix.NFNL_MSG_BATCH_BEGIN)}
	for i, m := range msgs {
		if i < len(msgs)-1 {
			m.Header.Flags &^= netlink.Acknowledge
		}
		batch = append(batch, m)
	}
	end, err := c.send(append(batch, marker(unix.NFNL_MSG_BATCH_END)))
	if err != nil {
		return err
	}
	last := end - 1
	return c.receive(func(_ uint16, seq uint32, _ []byte) bool { return seq == last })
}

// expires reports how long the kernel keeps element e: its remaining
// expiration, or 0 when it holds no such element.
func expires(e element) (time.Duration, error) {
	b, err := elemAttrs(e, 0)
	if err != nil {
		return 0, err
	}
	list, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: nested(1), Data: b}})
	if err != nil {
		return 0, err
	}
	t := sets()[e.set].Table
	body, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: attrListTable, Data: []byte(TableName + "\x00")},
		{Type: attrListSet, Data: []byte(e.set + "\x00")},
		{Type: nested(attrListElements), Data: list},
	})
	if err != nil {
		return 0, err
	}
	var d time.Duration
	err = request(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request},
		Data:   append(nfgen(uint8(t.Family), 0), body...),
	}, func(_ uint16, data []byte) bool {
		if len(data) >= 4 {
			d, _ = findExpiration(data[4:])
		}
		return true
	})
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	return d, err
}

// findExpiration reads NFTA_SET_ELEM_EXPIRATION from a set element
// message's attributes: the element list, its first element.
func findExpiration(b []byte) (time.Duration, bool) {
	for _, t := range []uint16{attrListElements, 1} {
		inner, ok := attribute(b, t)
		if !ok {
			return 0, false
		}
		b = inner
	}
	v, ok := attribute(b, attrElemExpires)
	if !ok || len(v) != 8 {
		return 0, false
	}
	return time.Duration(binary.BigEndian.Uint64(v)) * time.Millisecond, true
}

func attribute(b []byte, typ uint16) ([]byte, bool) {
	attrs, err := netlink.UnmarshalAttributes(b)
	if err != nil {
		return nil, false
	}
	for _, a := range attrs {
		if a.Type&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == typ {
			return a.Data, true
		}
	}
	return nil, false
}

// remove expires del (and adds add) in one batch, and deletes del instead
// when the kernel kept the first of them: one that ignores expiration
// updates of existing elements (before element timeout updates) would
// otherwise keep every removed element.
func remove(add, del []element) error {
	if err := writeElements(add, del, nil); err != nil || len(del) == 0 {
		return err
	}
	left, err := expires(del[0])
	if err != nil || left < goneAfter {
		return err
	}
	return writeElements(nil, nil, del)
}

// countRules counts chain's rules in galactic's table of its family
// without decoding them; 0 when the table or chain is gone.
func countRules(chain *nftables.Chain) (int, error) {
	body, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(chain.Table.Name + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain.Name + "\x00")},
	})
	if err != nil {
		return 0, err
	}
	n := 0
	err = request(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
		Data:   append(nfgen(uint8(chain.Table.Family), 0), body...),
	}, func(typ uint16, _ []byte) bool {
		if typ == unix.NLMSG_DONE {
			return true
		}
		n++
		return false
	})
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	return n, err
}
