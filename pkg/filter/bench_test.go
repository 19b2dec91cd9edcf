package filter

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkAddAndRemoveAt1000 measures one attachment's Add and Remove (as
// ADD and DEL make them, with the record's elements) on a node whose
// filter already holds 1,000 others.
func BenchmarkAddAndRemoveAt1000(b *testing.B) {
	inNetnsB(b, func() {
		var atts []Attachment
		for i := 0; i < 1000; i++ {
			a := blue()
			a.Interface = fmt.Sprintf("gv%013x", i)
			a.Sources = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 5}), 32)}
			atts = append(atts, a)
		}
		if _, err := Sync(atts); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := Add(blue()); err != nil {
				b.Fatal(err)
			}
			if err := Remove(blue().Interface, blue()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
