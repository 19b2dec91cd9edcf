package demo_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

// established is the line the demo prints once its fabric, nodes and
// daemons all run: killed after it, it has everything to clean up.
const established = "FRR: sessions with node-a, node-b and node-c established"

// A demo whose reader goes away (`make demo | head`) or that is sent
// SIGTERM stops, and leaves no process, network namespace or temporary
// directory of its own behind.
func TestADemoEndedEarlyLeavesNothingBehind(t *testing.T) {
	harness.RequireRoot(t)
	harness.RequireFRR(t)
	if err := vm.Available(); err != nil {
		t.Skipf("the demo's VM is a qemu guest: %v", err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "./test/cmd/demo")
	build.Dir = harness.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, d *demoRun)
	}{
		{"its stdout closed", func(t *testing.T, d *demoRun) { d.stdout.Close() }},
		{"SIGTERM", func(t *testing.T, d *demoRun) {
			if err := d.proc.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDemo(t, filepath.Join(bin, "demo"))
			d.waitFor(t, established)
			tc.end(t, d)
			select {
			case <-d.proc.Done():
			case <-time.After(5 * time.Minute):
				t.Fatalf("the demo did not exit within 5 minutes; its stderr:\n%s", d.stderr())
			}
			t.Logf("the demo exited (%v); its stderr:\n%s", d.proc.Err(), d.stderr())
			if left := d.leftovers(t); len(left) > 0 {
				t.Errorf("the demo left behind:\n  %s", strings.Join(left, "\n  "))
			}
		})
	}
}

// demoRun is one run of the demo binary with a temporary directory of
// its own (TMPDIR), so that everything it makes is told apart from the
// rest of the machine: its directories are in tmp, its processes name
// tmp or its network namespaces, which carry its pid.
type demoRun struct {
	proc   *harness.Process
	tmp    string
	stdout io.ReadCloser
	lines  chan string
	errf   string
}

func startDemo(t *testing.T, bin string) *demoRun {
	t.Helper()
	d := &demoRun{lines: make(chan string, 1024)}
	var err error
	if d.tmp, err = os.MkdirTemp("", "galactic-demo-test-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d.tmp) })
	d.errf = filepath.Join(t.TempDir(), "stderr")
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "TMPDIR="+d.tmp)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	errf, err := os.Create(d.errf)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = errf
	d.proc, err = harness.StartProcess("the demo", cmd, "")
	w.Close()
	errf.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.proc.Kill)
	d.stdout = r
	go func() {
		s := bufio.NewScanner(r)
		for s.Scan() {
			select {
			case d.lines <- s.Text():
			default:
			}
		}
		close(d.lines)
	}()
	return d
}

// waitFor reads the demo's output until a line containing s.
func (d *demoRun) waitFor(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(15 * time.Minute)
	for {
		select {
		case line, ok := <-d.lines:
			if !ok {
				t.Fatalf("the demo ended before %q; its stderr:\n%s", s, d.stderr())
			}
			if strings.Contains(line, s) {
				return
			}
		case <-timeout:
			t.Fatalf("the demo did not print %q within 15 minutes; its stderr:\n%s", s, d.stderr())
		}
	}
}

func (d *demoRun) stderr() string {
	b, _ := os.ReadFile(d.errf)
	return string(b)
}

// leftovers are the demo's processes, network namespaces and temporary
// directories that are still there.
func (d *demoRun) leftovers(t *testing.T) []string {
	t.Helper()
	var out []string
	// Its network namespaces are named after its pid.
	ours := regexp.MustCompile(`^gx[a-z]+` + strconv.Itoa(d.proc.Pid()%100000) + `-[0-9]+$`)
	list, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var netns []string
	for _, line := range strings.Split(string(list), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && ours.MatchString(f[0]) {
			netns = append(netns, f[0])
			out = append(out, "network namespace "+f[0])
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		cmdline := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		mine := strings.Contains(cmdline, d.tmp)
		for _, n := range netns {
			mine = mine || strings.Contains(cmdline, n)
		}
		if mine {
			out = append(out, fmt.Sprintf("process %s: %s", filepath.Base(filepath.Dir(p)), cmdline))
		}
	}
	entries, err := os.ReadDir(d.tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		out = append(out, "temporary "+filepath.Join(d.tmp, e.Name()))
	}
	return out
}
