package names

import "testing"

func TestTapMACIsStableLocallyAdministeredAndUnicast(t *testing.T) {
	a, b := TapMAC("blue", "web-0"), TapMAC("blue", "web-0")
	if a.String() != b.String() {
		t.Fatalf("%s then %s", a, b)
	}
	if a[0]&0x01 != 0 || a[0]&0x02 == 0 {
		t.Fatalf("%s is not a locally administered unicast MAC", a)
	}
	if TapMAC("blue", "web-1").String() == a.String() {
		t.Fatal("two attachments share a MAC")
	}
}
