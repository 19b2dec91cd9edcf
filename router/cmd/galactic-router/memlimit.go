package main

import (
	"bufio"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
)

// memoryShare is the part of the container's memory limit the Go heap may
// grow to before the collector works harder. The rest is the binary's
// mapped text and the kernel's memory the router's writes make, which
// the kernel charges to its cgroup: at 100,000 routes, 29 MiB of text
// and 42 MiB of kernel memory, so a 300 MiB container at 85% was killed
// before its heap reached the limit.
const memoryShare = 0.75

// cgroupMemoryLimit is the memory limit of the cgroup the process is in
// (v2 memory.max or v1 memory.limit_in_bytes, found through
// /proc/self/cgroup under root, normally "/"), 0 when there is none.
func cgroupMemoryLimit(root string) int64 {
	f, err := os.Open(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			file = filepath.Join(root, "sys/fs/cgroup", parts[2], "memory.max")
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			file = filepath.Join(root, "sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
		default:
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		// "max", or v1's page-rounded maximum for no limit.
		if err != nil || v <= 0 || v >= 1<<60 {
			continue
		}
		return v
	}
	return 0
}

// limitMemory keeps the Go heap within the container's memory limit
// unless GOMEMLIMIT says otherwise: without it the heap grows to twice
// what it keeps before a collection, which a node of many routes would
// take past the limit. It returns the limit set, 0 for none.
func limitMemory(getenv func(string) string, root string) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := cgroupMemoryLimit(root)
	if limit == 0 {
		return 0
	}
	soft := int64(float64(limit) * memoryShare)
	debug.SetMemoryLimit(soft)
	return soft
}

// gcPercent is the heap's growth over what it keeps before the next
// collection when GOGC is unset. The router's heap is mostly its RIB,
// which changes little once loaded: Go's default of 100 lets a node in
// 1,000 VPCs (100,000 routes) hold about twice that RIB while the routes
// arrive; at 30 it holds 1.3 times it, for collections about three times
// as often while routes change (about 15% more CPU over that load) and
// none once they stop.
const gcPercent = 30

// tuneGC sets gcPercent unless GOGC says otherwise, and returns the
// percentage set, 0 for none.
func tuneGC(getenv func(string) string) int {
	if getenv("GOGC") != "" {
		return 0
	}
	debug.SetGCPercent(gcPercent)
	return gcPercent
}

// logMemoryLimit applies tuneGC and limitMemory to this process and says
// which limit the heap has, if any.
func logMemoryLimit(log *slog.Logger) {
	if p := tuneGC(os.Getenv); p > 0 {
		log.Info("Go heap growth between collections", "percent", p)
	}
	switch soft := limitMemory(os.Getenv, "/"); {
	case soft > 0:
		log.Info("Go memory limit from the container's memory limit", "bytes", soft, "share", memoryShare)
	case os.Getenv("GOMEMLIMIT") != "":
		log.Info("Go memory limit from GOMEMLIMIT", "bytes", debug.SetMemoryLimit(-1))
	}
}
