package bench

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
)

// Machine describes where the run happened.
type Machine struct {
	CPUs   int
	Model  string
	Kernel string
	Go     string
	// Processes is how many processes /proc listed at the start (the tap
	// holder scan reads each one).
	Processes          int
	LoadStart, LoadEnd string
	// Sections are how busy the machine was as each section began.
	Sections []SectionStart
}

// Versions are the components measured.
type Versions struct {
	Galactic, CNI, Plugins, ClientGo, APIServer, Etcd string
	// CRI names the container runtime of the pod sandbox section.
	CRI string
	// Dirty lists the tracked files that differed from the commit when the
	// run began; a report of such a tree belongs to no commit.
	Dirty []string
}

func readMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadAverage()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.Model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if entries, err := os.ReadDir("/proc"); err == nil {
		for _, e := range entries {
			if strings.Trim(e.Name(), "0123456789") == "" {
				m.Processes++
			}
		}
	}
	return m
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func readVersions() Versions {
	v := Versions{Galactic: gitDescribe()}
	v.Dirty, _ = DirtyFiles()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/containernetworking/cni":
				v.CNI = d.Version
			case "github.com/containernetworking/plugins":
				v.Plugins = d.Version
			case "k8s.io/client-go":
				v.ClientGo = d.Version
			}
		}
	}
	// Built from the module proxy without release ldflags, kube-apiserver
	// cannot name its version; the tools module that built it can.
	tools := toolVersions()
	v.APIServer, v.Etcd = "k8s.io/kubernetes "+tools["k8s.io/kubernetes"], "go.etcd.io/etcd/server/v3 "+tools["go.etcd.io/etcd/server/v3"]
	v.CRI = criVersions()
	return v
}

// toolVersions reads the required versions of test/tools/go.mod.
func toolVersions() map[string]string {
	return modVersions(filepath.Join(harness.RepoRoot(), "test", "tools", "go.mod"))
}

// modVersions reads the required versions of a go.mod.
func modVersions(path string) map[string]string {
	out := map[string]string{}
	data, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && strings.HasPrefix(f[1], "v") {
			out[f[0]] = f[1]
		}
	}
	return out
}

// DirtyFiles lists the tracked files of the checkout that differ from its
// commit (untracked files do not count: they are not in any build).
func DirtyFiles() ([]string, error) {
	cmd := exec.Command("git", "status", "--porcelain", "--untracked-files=no")
	cmd.Dir = harness.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git status: %w", err)
	}
	var files []string
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if len(line) > 3 {
			files = append(files, line[3:])
		}
	}
	return files, nil
}

func gitDescribe() string {
	cmd := exec.Command("git", "describe", "--always", "--dirty", "--exclude", "*")
	cmd.Dir = harness.RepoRoot()
	s := firstLine(cmd.Output())
	if s == "" {
		return "unknown"
	}
	return s
}

func firstLine(out []byte, err error) string {
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// binarySize is the size of a file in the bin dir, 0 if missing.
func binarySize(dir, name string) int64 {
	st, err := os.Stat(filepath.Join(dir, name))
	if err != nil {
		return 0
	}
	return st.Size()
}

// cpuTimes is /proc/stat's first line: busy and total jiffies of all CPUs.
func cpuTimes() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	// user nice system idle iowait irq softirq steal; the guest fields
	// after them are already counted in user and nice.
	for i, s := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total, nil
}

// busyOver is the share of all CPUs' time spent busy over d.
func busyOver(d time.Duration) (float64, error) {
	b0, t0, err := cpuTimes()
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	b1, t1, err := cpuTimes()
	if err != nil || t1 == t0 {
		return 0, err
	}
	return float64(b1-b0) / float64(t1-t0), nil
}

// SectionStart is how busy the machine was when a section began.
type SectionStart struct {
	Name string
	// Busy is the CPUs' busy share over the last second before it.
	Busy float64
	// Waited is how long the section waited for the machine to quieten.
	Waited time.Duration
}

const (
	// quiet is the busy share a section waits for: what a previous
	// section left behind (a namespace's teardown in the kernel's
	// workqueues, processes exiting, its etcd writes compacting) would
	// otherwise fall on the next one's figures.
	quiet     = 0.10
	settleMax = time.Minute
)

// settle waits, up to settleMax, until the machine's CPUs are quiet.
func settle(name string) SectionStart {
	// The bench process's own garbage from the sections before is not
	// the next one's to collect.
	debug.FreeOSMemory()
	s := SectionStart{Name: name}
	start := time.Now()
	for {
		busy, err := busyOver(time.Second)
		if err != nil {
			return s
		}
		s.Busy, s.Waited = busy, time.Since(start)-time.Second
		if busy <= quiet || time.Since(start) >= settleMax {
			return s
		}
	}
}
