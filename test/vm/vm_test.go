package vm

import (
	"bytes"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// cpioEntry is one entry read back from a newc archive.
type cpioEntry struct {
	name       string
	mode       uint32
	rdev       [2]uint32
	data       string
	nameOffset int
}

// readCpio parses a newc archive, checking the alignment the kernel needs.
func readCpio(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("bad header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	for {
		if off%4 != 0 {
			t.Fatalf("entry at %d is not 4-byte aligned", off)
		}
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, b[off:off+6])
		}
		mode, size, namesize := field(1), int(field(6)), int(field(11))
		e := cpioEntry{mode: mode, rdev: [2]uint32{field(9), field(10)}}
		start := off + 110
		e.name = string(b[start : start+namesize-1])
		if b[start+namesize-1] != 0 {
			t.Fatalf("name of %q is not NUL-terminated", e.name)
		}
		data := (start + namesize + 3) &^ 3
		e.data = string(b[data : data+size])
		off = (data + size + 3) &^ 3
		if e.name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, e)
	}
}

func TestTheCpioWriterWritesAlignedNewcEntriesWithParentsFirst(t *testing.T) {
	var buf bytes.Buffer
	c := newCpioWriter(&buf)
	c.File("/usr/lib/x/hello", 0o644, 5, strings.NewReader("hello"))
	c.Symlink("var/run", "/run")
	c.CharDev("dev/console", 0o600, 5, 1)
	c.File("usr/lib/x/odd", 0o755, 3, strings.NewReader("abc"))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range readCpio(t, buf.Bytes()) {
		got = append(got, e.name)
		switch e.name {
		case "usr/lib/x/hello":
			if e.data != "hello" || e.mode != syscall.S_IFREG|0o644 {
				t.Errorf("hello: data %q mode %o", e.data, e.mode)
			}
		case "var/run":
			if e.data != "/run" || e.mode&syscall.S_IFMT != syscall.S_IFLNK {
				t.Errorf("symlink: target %q mode %o", e.data, e.mode)
			}
		case "dev/console":
			if e.rdev != [2]uint32{5, 1} || e.mode&syscall.S_IFMT != syscall.S_IFCHR {
				t.Errorf("console: rdev %v mode %o", e.rdev, e.mode)
			}
		}
	}
	want := []string{"usr", "usr/lib", "usr/lib/x", "usr/lib/x/hello", "var", "var/run", "dev", "dev/console", "usr/lib/x/odd"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
}

func TestTheCpioWriterReportsAShortSource(t *testing.T) {
	c := newCpioWriter(io.Discard)
	c.File("f", 0o644, 10, strings.NewReader("short"))
	if err := c.Close(); err == nil || !strings.Contains(err.Error(), "writing f") {
		t.Fatalf("want an error naming f, got %v", err)
	}
}

func TestTheInitScriptLoadsModulesInOrderAndQuotesTheEnvironment(t *testing.T) {
	im := Image{
		Kernel:  &Kernel{Release: "6.1.0-test", Modules: []Module{{Name: "dep"}, {Name: "vrf", Depends: []string{"dep"}}}},
		Env:     []string{"A=it's here", "B=x=y"},
		Command: "/bin/run -v",
	}
	s := im.initScript()
	for _, want := range []string{
		"insmod /lib/modules/6.1.0-test/dep.ko",
		"export A='it'\\''s here'\n",
		"export B='x=y'\n",
		"/bin/run -v\nfinish $?\n",
		`echo "` + MarkerBooted + `$(uname -r)"`,
		`echo "` + MarkerExit + `$1"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("init script lacks %q:\n%s", want, s)
		}
	}
	if strings.Index(s, "dep.ko") > strings.Index(s, "vrf.ko") {
		t.Errorf("dep must load before vrf:\n%s", s)
	}
}

func TestLoadOrderPutsDependenciesFirst(t *testing.T) {
	mods := map[string]*Module{
		"a": {Name: "a", Depends: []string{"c"}},
		"b": {Name: "b"},
		"c": {Name: "c", Depends: []string{"b"}},
	}
	var got []string
	for _, m := range loadOrder(mods) {
		got = append(got, m.Name)
	}
	if want := []string{"b", "c", "a"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestModuleFileNamesModulesAsTheKernelDoes(t *testing.T) {
	for in, want := range map[string]string{
		"lib/modules/6.1.0/kernel/drivers/net/vrf.ko":        "vrf",
		"usr/lib/modules/6.12/kernel/net/x/nf-nat.ko.xz":     "nf_nat",
		"lib/modules/6.1.0/kernel/drivers/net/veth.ko.zst":   "veth",
		"lib/modules/6.1.0/kernel/drivers/net/vrf.ko.sig":    "",
		"usr/share/doc/linux-image-6.1.0-57-amd64/changelog": "",
	} {
		got, ok := moduleFile(in)
		if got != want || ok != (want != "") {
			t.Errorf("moduleFile(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestTheConsoleGivesTheReleaseTheExitStatusAndTheGoTests(t *testing.T) {
	log := "SeaBIOS\r\n" + MarkerBooted + "6.1.0-57-amd64\r\n" +
		"=== RUN   TestA\r\n--- PASS: TestA (0.01s)\r\n=== RUN   TestB\r\n    --- FAIL: TestB/sub (0.00s)\r\n--- FAIL: TestB (0.02s)\r\n" +
		"--- SKIP: TestC (0.00s)\r\nFAIL\r\n\r\n" + MarkerExit + "1\r\n[    3.1] reboot: Power down\r\n"
	r := parseConsole(log)
	if r.Release != "6.1.0-57-amd64" || r.Exit != 1 || strings.Contains(r.Log, "\r") {
		t.Fatalf("release %q exit %d, carriage returns left: %v", r.Release, r.Exit, strings.Contains(r.Log, "\r"))
	}
	want := map[string]string{"TestA": "PASS", "TestB": "FAIL", "TestB/sub": "FAIL", "TestC": "SKIP"}
	if got := r.GoTests(); !reflect.DeepEqual(got, want) {
		t.Fatalf("tests %v, want %v", got, want)
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "status 1") {
		t.Fatalf("want an error with the exit status, got %v", err)
	}
}

func TestResultErrSaysHowFarTheVMGot(t *testing.T) {
	for _, tc := range []struct {
		r    Result
		want string
	}{
		{Result{Exit: -1, TimedOut: true}, "did not reach /init"},
		{Result{Exit: -1}, "stopped before /init ran"},
		{Result{Release: "6.1", Exit: -1, TimedOut: true}, "did not finish"},
		{Result{Release: "6.1", Exit: -1}, "stopped before its command finished"},
		{Result{Release: "6.1", Exit: 3}, "exited with status 3"},
	} {
		if err := tc.r.Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: want %q, got %v", tc.r, tc.want, err)
		}
	}
	if err := (&Result{Release: "6.1", Exit: 0}).Err(); err != nil {
		t.Errorf("exit 0 is success, got %v", err)
	}
}

func TestModinfoDependsReadsACachedModule(t *testing.T) {
	kos, _ := filepath.Glob(filepath.Join(CacheDir(), "linux-image-*", "vrf.ko"))
	if len(kos) == 0 {
		t.Skip("no cached kernel module to read (the VRF integration test fetches one)")
	}
	data, err := os.ReadFile(kos[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := modinfoDepends(data); err != nil {
		t.Fatalf("reading %s: %v", kos[0], err)
	}
	if _, err := modinfoDepends([]byte("not an ELF file")); err == nil {
		t.Fatal("a non-ELF module should be an error")
	}
}

func TestAnImageWithAModuleListLoadsOnlyThoseAndTheirDependencies(t *testing.T) {
	im := Image{
		Kernel: &Kernel{Release: "6.1", Modules: []Module{
			{Name: "failover"}, {Name: "net_failover", Depends: []string{"failover"}},
			{Name: "virtio"}, {Name: "virtio_net", Depends: []string{"virtio", "net_failover"}}, {Name: "vrf"},
		}},
		Modules: []string{"virtio-net"},
	}
	var got []string
	for _, m := range im.modules() {
		got = append(got, m.Name)
	}
	if want := []string{"failover", "net_failover", "virtio", "virtio_net"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("modules %v, want %v", got, want)
	}
	if s := im.initScript(); strings.Contains(s, "vrf.ko") {
		t.Fatalf("the init script loads a module nobody asked for:\n%s", s)
	}
}

func TestTheQEMUCommandLineOpensTheTapByNameWithoutScripts(t *testing.T) {
	a := &GuestAssets{Kernel: &Kernel{Image: "/k/vmlinuz"}, Initrd: "/k/initrd"}
	args := strings.Join(QEMUArgs(a, GuestOptions{
		Tap: "gt0123456789abc", MTU: 1450, Accel: AccelTCG,
		Addresses: []netip.Prefix{netip.MustParsePrefix("10.20.0.5/24"), netip.MustParsePrefix("fd20::5/64")},
		Gateways:  []netip.Addr{netip.MustParseAddr("10.20.0.1"), netip.MustParseAddr("fd20::1")},
	}), " ")
	for _, want := range []string{
		"-netdev tap,id=net0,ifname=gt0123456789abc,script=no,downscript=no",
		"-device virtio-net-pci,netdev=net0,host_mtu=1450",
		"galactic.addrs=10.20.0.5/24,fd20::5/64 galactic.gateways=10.20.0.1,fd20::1",
		"-accel tcg",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu arguments lack %q:\n%s", want, args)
		}
	}
}
