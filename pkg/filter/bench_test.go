package filter

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkAddAndRemoveAt1000 measures one attachment's Add and Remove (as
// ADD and DEL make them, with the record's elements) on a node whose
// filter already holds 1,000 others: with its addresses only, and with an
// allowedSourcePrefixes prefix, which goes to the interval sets.
func BenchmarkAddAndRemoveAt1000(b *testing.B) {
	hosts := blue()
	hosts.Sources = hosts.Sources[:2]
	for name, a := range map[string]Attachment{"addresses": hosts, "with-prefix": blue()} {
		b.Run(name, func(b *testing.B) {
			inNetnsB(b, func() {
				// Add attaches the classifier: the interface must exist.
				hostIf(b, a.Interface)
				var atts []Attachment
				for i := 0; i < 1000; i++ {
					r := blue()
					r.Interface = fmt.Sprintf("gv%013x", i)
					r.Sources = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 5}), 32)}
					atts = append(atts, r)
				}
				if _, err := k.Sync(atts); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := k.Add(a); err != nil {
						b.Fatal(err)
					}
					if err := k.Remove(a.Interface, a); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
