package filter

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// A plugin process looks up the namespace's program among the kernel's on
// every ADD. ebpf's Info reads every field and probes the kernel's features
// on first use (about 0.1 ms a program in a new process); these read the
// two fields the lookup needs with one BPF_OBJ_GET_INFO_BY_FD each.

// Offsets in struct bpf_prog_info and struct bpf_map_info (uapi/linux/bpf.h).
const (
	progInfoNrMapIDs = 52
	progInfoMapIDs   = 56
	progInfoName     = 64
	mapInfoName      = 24
	objNameLen       = 16
)

// objInfo fills info, the leading bytes of the object's info struct.
func objInfo(fd int, info []byte, pinned ...any) error {
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&info[0])
	for _, p := range pinned {
		pin.Pin(p)
	}
	attr := struct {
		fd, len uint32
		info    uint64
	}{uint32(fd), uint32(len(info)), uint64(uintptr(unsafe.Pointer(&info[0])))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return errno
	}
	return nil
}

func objName(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// progNameAndMaps returns a program's name and the IDs of its maps (of
// the first eight; no program of galactic's has more than one).
func progNameAndMaps(p *ebpf.Program) (string, []ebpf.MapID, error) {
	var mapIDs [8]uint32
	info := make([]byte, progInfoName+objNameLen)
	binary.NativeEndian.PutUint32(info[progInfoNrMapIDs:], uint32(len(mapIDs)))
	binary.NativeEndian.PutUint64(info[progInfoMapIDs:], uint64(uintptr(unsafe.Pointer(&mapIDs[0]))))
	if err := objInfo(p.FD(), info, &mapIDs[0]); err != nil {
		return "", nil, err
	}
	n := min(int(binary.NativeEndian.Uint32(info[progInfoNrMapIDs:])), len(mapIDs))
	ids := make([]ebpf.MapID, n)
	for i := range ids {
		ids[i] = ebpf.MapID(mapIDs[i])
	}
	return objName(info[progInfoName:]), ids, nil
}

func mapObjName(m *ebpf.Map) (string, error) {
	info := make([]byte, mapInfoName+objNameLen)
	if err := objInfo(m.FD(), info); err != nil {
		return "", err
	}
	return objName(info[mapInfoName:]), nil
}
