package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// RepoRoot is the checkout this package was compiled from.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// CacheDir is where built control-plane binaries are kept between runs:
// $GALACTIC_CACHE_DIR, else $XDG_CACHE_HOME/galactic, else ~/.cache/galactic.
func CacheDir() string {
	if d := os.Getenv("GALACTIC_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "galactic")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "galactic-cache")
	}
	return filepath.Join(home, ".cache", "galactic")
}

// Binaries are the control-plane programs the harness runs.
type Binaries struct {
	Etcd      string
	APIServer string
}

// toolBuild describes one binary built from the tools module.
type toolBuild struct {
	name, pkg string
	estimate  time.Duration
}

var controlPlaneTools = []toolBuild{
	{"etcd", "go.etcd.io/etcd/server/v3", time.Minute},
	{"kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", 9 * time.Minute},
}

// EnsureControlPlaneBinaries builds etcd and kube-apiserver from the Go
// module proxy the first time and reuses them afterwards. The cache key is
// the tools module's go.sum, so a version change rebuilds. progress gets one
// line per build with an estimate.
func EnsureControlPlaneBinaries(progress io.Writer) (Binaries, error) {
	dir, err := toolsCacheDir()
	if err != nil {
		return Binaries{}, err
	}
	paths, err := ensureTools(dir, controlPlaneTools, progress)
	if err != nil {
		return Binaries{}, err
	}
	return Binaries{Etcd: paths[0], APIServer: paths[1]}, nil
}

// EnsureTool builds one program of the tools module (such as controller-gen)
// into the cache and returns its path.
func EnsureTool(name, pkg string, progress io.Writer) (string, error) {
	dir, err := toolsCacheDir()
	if err != nil {
		return "", err
	}
	paths, err := ensureTools(dir, []toolBuild{{name, pkg, time.Minute}}, progress)
	if err != nil {
		return "", err
	}
	return paths[0], nil
}

func toolsCacheDir() (string, error) {
	sum, err := os.ReadFile(filepath.Join(RepoRoot(), "test", "tools", "go.sum"))
	if err != nil {
		return "", fmt.Errorf("reading the tools module: %w", err)
	}
	h := sha256.Sum256(sum)
	return filepath.Join(CacheDir(), "tools-"+hex.EncodeToString(h[:])[:12]), nil
}

func ensureTools(dir string, tools []toolBuild, progress io.Writer) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// One builder at a time: test packages run in parallel and must not
	// build the same nine-minute binary twice.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	var paths []string
	for _, t := range tools {
		out := filepath.Join(dir, t.name)
		paths = append(paths, out)
		if _, err := os.Stat(out); err == nil {
			continue
		}
		if progress != nil {
			fmt.Fprintf(progress, "building %s from the Go module proxy (first run only, about %s on 2 cores)...\n", t.name, t.estimate)
		}
		start := time.Now()
		tmp := out + ".tmp"
		cmd := exec.Command("go", "build", "-o", tmp, t.pkg)
		cmd.Dir = filepath.Join(RepoRoot(), "test", "tools")
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %v\n%s", t.name, err, b)
		}
		if err := os.Rename(tmp, out); err != nil {
			return nil, err
		}
		if progress != nil {
			fmt.Fprintf(progress, "built %s in %s\n", t.name, time.Since(start).Round(time.Second))
		}
	}
	return paths, nil
}
