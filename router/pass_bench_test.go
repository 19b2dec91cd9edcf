package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/speaker"
)

func BenchmarkAPassOverTenThousandPathsSelectsAndHolds(b *testing.B) {
	a := &Adj{Stale: time.Hour, Sync: 30 * time.Second}
	now := time.Now()
	a.Apply(now, up("192.0.2.1"))
	var rs []speaker.Received
	for i := 0; i < 10000; i++ {
		r := received("192.0.2.12", fmt.Sprintf("10.%d.%d.%d/32", 30+i/65536, (i/256)%256, i%256), 10100, 0, false)
		rs = append(rs, r)
	}
	a.Apply(now, paths("192.0.2.1", rs...))
	h := &Holder{Hold: 10 * time.Second}
	managed := map[string]bool{"blue": true}
	var prev Fences
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a.Expire(now)
		rib := a.RIB()
		sel, f := Select(rib, 65000, vnis, prev)
		prev = f
		h.Desired(now, sel, f, managed, false)
	}
}
