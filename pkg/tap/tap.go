// Package tap tells whether a tap device is in use by a VMM. Two signals
// are read: carrier (the kernel raises it on an up tap while a tun file is
// attached to it) and the processes whose /proc/<pid>/fdinfo shows a tun fd
// bound to the tap (`iff: <name>`). Either one means the tap is held.
//
// Interface names are per network namespace, so a process only counts
// when it is in the caller's network namespace; a VMM that attached and
// then moved to another namespace still shows as carrier.
package tap

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Status is what the kernel shows about a tap.
type Status struct {
	Name  string
	Index int
	// Carrier is set while the tap is up and a tun file is attached.
	Carrier bool
	// Holders are the PIDs with a tun fd bound to the tap.
	Holders []int
}

// Held reports whether a process (a VMM) is attached to the tap.
func (s Status) Held() bool { return s.Carrier || len(s.Holders) > 0 }

// Inspect returns the status of the tap called name in the caller's
// network namespace; ok is false when there is no tap of that name.
func Inspect(name string) (s Status, ok bool, err error) {
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return Status{}, false, nil
		}
		return Status{}, false, err
	}
	if _, isTap := l.(*netlink.Tuntap); !isTap {
		return Status{}, false, nil
	}
	return inspectLink(l)
}

// InspectLink is Inspect for a link already looked up.
func InspectLink(l netlink.Link) (Status, error) {
	s, _, err := inspectLink(l)
	return s, err
}

func inspectLink(l netlink.Link) (Status, bool, error) {
	holders, err := Holders("/proc", l.Attrs().Name)
	return StatusOf(l, map[string][]int{l.Attrs().Name: holders}), true, err
}

// StatusOf is the status of a tap given the holders AllHolders found, so a
// caller looking at many taps scans /proc once.
func StatusOf(l netlink.Link, holders map[string][]int) Status {
	a := l.Attrs()
	return Status{
		Name: a.Name, Index: a.Index,
		Carrier: a.RawFlags&unix.IFF_UP != 0 && a.RawFlags&unix.IFF_LOWER_UP != 0,
		Holders: holders[a.Name],
	}
}

// Holders returns the PIDs under procRoot whose open tun files are bound
// to the interface called name and that share the calling thread's network
// namespace. Processes that exit while being read are skipped.
func Holders(procRoot, name string) ([]int, error) {
	all, err := AllHolders(procRoot)
	return all[name], err
}

// AllHolders maps every interface a tun file is bound to, in the calling
// thread's network namespace, to the PIDs holding it. One scan of procRoot
// serves any number of taps.
func AllHolders(procRoot string) (map[string][]int, error) {
	self, err := netnsID(filepath.Join(procRoot, "thread-self/ns/net"))
	if err != nil {
		return nil, fmt.Errorf("reading own network namespace: %w", err)
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	held := map[string][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		if id, err := netnsID(filepath.Join(dir, "ns/net")); err != nil || id != self {
			continue
		}
		for _, name := range bound(dir) {
			if pids := held[name]; len(pids) == 0 || pids[len(pids)-1] != pid {
				held[name] = append(pids, pid)
			}
		}
	}
	return held, nil
}

// netnsID identifies a network namespace by its nsfs link target.
func netnsID(path string) (string, error) {
	return os.Readlink(path)
}

// bound lists the interfaces the tun fds of the process at dir are bound to.
func bound(dir string) []string {
	fds, err := os.ReadDir(filepath.Join(dir, "fdinfo"))
	if err != nil {
		return nil
	}
	var names []string
	for _, fd := range fds {
		// Only tun files carry an iff line; checking the fd's target first
		// avoids reading every socket's and file's fdinfo. A jailed VMM's
		// tun node shows with its chroot in front.
		target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
		if err != nil || !strings.HasSuffix(target, "/net/tun") {
			continue
		}
		if iff, err := boundInterface(filepath.Join(dir, "fdinfo", fd.Name())); err == nil {
			names = append(names, iff)
		}
	}
	return names
}

// boundInterface reads the `iff:` line of a tun file's fdinfo.
func boundInterface(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "iff:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fs.ErrNotExist
}
