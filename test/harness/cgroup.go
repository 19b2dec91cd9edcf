package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memoryCgroup makes a memory cgroup of limit bytes under this process's
// own (cgroup v1's memory hierarchy, else v2's unified one), as a
// container's memory limit is: the process that joins it is killed when
// it needs more, and galactic-router reads the limit to size its heap.
func memoryCgroup(name string, limit int64) (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var v1, v2 string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case containsWord(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	dir, file := "", ""
	switch {
	case v1 != "":
		dir, file = filepath.Join("/sys/fs/cgroup/memory", v1, name), "memory.limit_in_bytes"
	case v2 != "":
		dir, file = filepath.Join("/sys/fs/cgroup", v2, name), "memory.max"
	default:
		return "", fmt.Errorf("no memory cgroup in /proc/self/cgroup")
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		os.Remove(dir)
		return "", fmt.Errorf("setting the memory limit of %s: %w", dir, err)
	}
	return dir, nil
}

func containsWord(list, w string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == w {
			return true
		}
	}
	return false
}
