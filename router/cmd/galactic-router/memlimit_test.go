package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

// fakeRoot is a directory with files at the given paths.
func fakeRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestTheCgroupsMemoryLimitIsFoundInV1AndV2AndNoLimitIsNone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"v2, in the container's own namespace", map[string]string{
			"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"}, 268435456},
		{"v2 without a limit", map[string]string{
			"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 0},
		{"v1, under a path", map[string]string{
			"proc/self/cgroup": "4:memory:/kubepods/pod1/c1\n3:cpuset:/\n0::/\n",
			"sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes": "314572800\n"}, 314572800},
		{"v1 without a limit", map[string]string{
			"proc/self/cgroup": "5:cpuacct,memory:/\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"no cgroup file", map[string]string{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cgroupMemoryLimit(fakeRoot(t, tc.files)); got != tc.want {
				t.Errorf("limit %d, want %d", got, tc.want)
			}
		})
	}
}

func TestGOMEMLIMITWinsOverTheCgroup(t *testing.T) {
	root := fakeRoot(t, map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"})
	getenv := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "100MiB"
		}
		return ""
	}
	if got := limitMemory(getenv, root); got != 0 {
		t.Errorf("set %d with GOMEMLIMIT given, want nothing set", got)
	}
}

func TestGOGCWinsOverTheRoutersGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	if got := tuneGC(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	}); got != 0 || debug.SetGCPercent(100) != 100 {
		t.Errorf("tuneGC set %d with GOGC given, want nothing set", got)
	}
	if got := tuneGC(func(string) string { return "" }); got != gcPercent || debug.SetGCPercent(100) != gcPercent {
		t.Errorf("tuneGC set %d without GOGC, want %d", got, gcPercent)
	}
}
