package tap

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fakeProc builds a /proc with processes: pid -> (netns, fd targets and
// their fdinfo).
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T, selfNetns string) *fakeProc {
	p := &fakeProc{t: t, root: t.TempDir()}
	p.link("thread-self/ns/net", selfNetns)
	return p
}

func (p *fakeProc) link(rel, target string) {
	path := filepath.Join(p.root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		p.t.Fatal(err)
	}
}

func (p *fakeProc) file(rel, content string) {
	path := filepath.Join(p.root, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// process adds pid in netns with one fd to target whose fdinfo binds iff.
func (p *fakeProc) process(pid, netns, target, iff string) {
	p.link(pid+"/ns/net", netns)
	p.link(pid+"/fd/7", target)
	info := "pos:\t0\nflags:\t0100002\nmnt_id:\t25\n"
	if iff != "" {
		info += "iff:\t" + iff + "\n"
	}
	p.file(pid+"/fdinfo/7", info)
}

func TestHoldersAreTheProcessesInThisNetnsWithATunFdBoundToTheTap(t *testing.T) {
	p := newFakeProc(t, "net:[4026531840]")
	p.process("100", "net:[4026531840]", "/dev/net/tun", "gt0123456789abc")
	p.process("101", "net:[4026531840]", "/srv/jailer/firecracker/vm/root/dev/net/tun", "gt0123456789abc")
	p.process("200", "net:[4026532000]", "/dev/net/tun", "gt0123456789abc") // same name, other netns
	p.process("300", "net:[4026531840]", "/dev/net/tun", "gt9999999999999")
	p.process("400", "net:[4026531840]", "socket:[1234]", "gt0123456789abc")
	p.process("500", "net:[4026531840]", "/dev/net/tun", "") // opened, never bound
	p.file("self/status", "not a pid directory")

	got, err := Holders(p.root, "gt0123456789abc")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{100, 101}) {
		t.Fatalf("holders %v, want [100 101]", got)
	}
	if got, _ := Holders(p.root, "gtfree"); len(got) != 0 {
		t.Fatalf("a tap nobody holds has holders %v", got)
	}
}

func TestATapIsHeldWithCarrierOrAHolder(t *testing.T) {
	for _, tc := range []struct {
		s    Status
		held bool
	}{
		{Status{}, false},
		{Status{Carrier: true}, true},
		{Status{Holders: []int{42}}, true},
	} {
		if tc.s.Held() != tc.held {
			t.Errorf("%+v: held %v, want %v", tc.s, tc.s.Held(), tc.held)
		}
	}
}
