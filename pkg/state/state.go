// Package state keeps galactic-cni's node-local records: one file per
// (containerID, ifName) with what DEL and GC need, so neither depends on the
// API server. It also holds the node-level lock that serializes changes to
// shared kernel state (routing domains).
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Record is what one galactic-cni ADD set up on this node.
type Record struct {
	// Network is the network config list's name; CNI GC is per network.
	Network     string `json:"network,omitempty"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
	// VPC and Attachment name the attachment on the node: an inline
	// attachment's stanza names, an object-backed one's data-plane names
	// (the VPCAttachment's status.dataplane).
	VPC        string `json:"vpc"`
	Attachment string `json:"attachment"`
	// Namespace, AttachmentName and AttachmentUID are the VPCAttachment of
	// an object-backed attachment; empty for an inline one. The UID is its
	// identity: anything of another UID is a predecessor's.
	Namespace      string `json:"namespace,omitempty"`
	AttachmentName string `json:"attachmentName,omitempty"`
	AttachmentUID  string `json:"attachmentUID,omitempty"`
	// VNI and Announce are an object-backed attachment's, for galactic-bgp,
	// which reads them here instead of from the API.
	VNI      int32  `json:"vni,omitempty"`
	Announce string `json:"announce,omitempty"`
	// ChainIfName is the CNI_IFNAME of the ADD that wrote the record when
	// it is not IfName: a pod's second and later attachments (net1, ...).
	ChainIfName string `json:"chainIfName,omitempty"`
	// Mode is tap or veth; Routing is vrf or table.
	Mode    string `json:"mode"`
	Routing string `json:"routing"`
	// HostInterface is the host-side device and HostIfIndex its index when
	// this record was written.
	HostInterface string `json:"hostInterface"`
	HostIfIndex   int    `json:"hostIfIndex"`
	// Table is the VPC's routing table on this node.
	Table int `json:"table"`
	// Addresses are the attachment's addresses (CIDR) as configured.
	Addresses []string `json:"addresses,omitempty"`
	// AllowedSourcePrefixes are the sources the workload may send from
	// beyond its addresses; SandboxMAC is a veth's container-end MAC. The
	// packet filter's elements are made from them (pkg/filter).
	AllowedSourcePrefixes []string `json:"allowedSourcePrefixes,omitempty"`
	SandboxMAC            string   `json:"sandboxMAC,omitempty"`
	// Holder is the handoff lease holder identity this ADD acquired, empty
	// without handoff; HolderGeneration is the lease's fencing token then.
	Holder           string `json:"holder,omitempty"`
	HolderGeneration int64  `json:"holderGeneration"`
	// LeaseSeconds is the lease duration the holder asked for.
	LeaseSeconds int32 `json:"leaseSeconds,omitempty"`
	// Standby marks a live-migration target's attachment: its interface
	// exists but it took no lease and has no host routes until promoted.
	// WaitSeconds is how long its promotion waits for the lease.
	Standby     bool      `json:"standby,omitempty"`
	WaitSeconds int32     `json:"waitSeconds,omitempty"`
	Created     time.Time `json:"created"`
}

// Chain is the CNI_IFNAME of the ADD (and so of the DEL, CHECK and GC
// entry) the record belongs to.
func (r Record) Chain() string {
	if r.ChainIfName != "" {
		return r.ChainIfName
	}
	return r.IfName
}

// Store reads and writes records under <stateDir>/records.
type Store struct {
	Dir string
}

// NewStore returns the record store of a state dir.
func NewStore(stateDir string) Store {
	return Store{Dir: filepath.Join(stateDir, "records")}
}

// path is records/<containerID>/<ifName>.json: the CNI spec forbids "/" in
// both, so the pair maps to exactly one file.
func (s Store) path(containerID, ifName string) (string, error) {
	for _, v := range []string{containerID, ifName} {
		if v == "" || v == "." || v == ".." || strings.ContainsAny(v, "/\x00") {
			return "", fmt.Errorf("invalid record key %q", v)
		}
	}
	return filepath.Join(s.Dir, containerID, ifName+".json"), nil
}

// Put writes r atomically (temp file, fsync, rename).
func (s Store) Put(r Record) error {
	p, err := s.path(r.ContainerID, r.IfName)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return WriteFileAtomic(p, data, 0o600)
}

// Get returns the record of (containerID, ifName); ok is false when there is none.
func (s Store) Get(containerID, ifName string) (r Record, ok bool, err error) {
	p, err := s.path(containerID, ifName)
	if err != nil {
		return Record{}, false, err
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, false, fmt.Errorf("record %s: %w", p, err)
	}
	return r, true, nil
}

// Delete removes a record; a missing one is not an error.
func (s Store) Delete(containerID, ifName string) error {
	p, err := s.path(containerID, ifName)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// The container's directory goes with its last record.
	_ = os.Remove(filepath.Dir(p))
	return nil
}

// List returns every record. A record that cannot be read is reported in
// the error but does not hide the others.
func (s Store) List() ([]Record, error) {
	files, err := filepath.Glob(filepath.Join(s.Dir, "*", "*.json"))
	if err != nil {
		return nil, err
	}
	var recs []Record
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed by a concurrent DEL
		}
		var r Record
		if err == nil {
			err = json.Unmarshal(data, &r)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("record %s: %w", f, err))
			continue
		}
		recs = append(recs, r)
	}
	return recs, errors.Join(errs...)
}

// Invocation returns the records one CNI invocation, (containerID,
// chainIfName), wrote: its own and those of the pod's further
// attachments, ordered by interface as the ADD made them.
func (s Store) Invocation(containerID, chainIfName string) ([]Record, error) {
	if _, err := s.path(containerID, chainIfName); err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(s.Dir, containerID, "*.json"))
	if err != nil {
		return nil, err
	}
	var recs []Record
	var errs []error
	for _, f := range files {
		r, ok, err := s.Get(containerID, strings.TrimSuffix(filepath.Base(f), ".json"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok && r.Chain() == chainIfName {
			recs = append(recs, r)
		}
	}
	slices.SortFunc(recs, func(a, b Record) int {
		// The chain's own interface first, then net1, net2, ... in number order.
		if a.IfName == chainIfName || b.IfName == chainIfName {
			return boolInt(b.IfName == chainIfName) - boolInt(a.IfName == chainIfName)
		}
		if len(a.IfName) != len(b.IfName) {
			return len(a.IfName) - len(b.IfName)
		}
		return strings.Compare(a.IfName, b.IfName)
	})
	return recs, errors.Join(errs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// WriteFileAtomic replaces path with data so readers see the old or the new
// content, never a partial file.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Lock takes the node-level lock of a state dir, waiting for it. The
// returned function releases it. The lock is an flock, so it is released if
// the process dies.
func Lock(stateDir string) (unlock func(), err error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(stateDir, "node.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}
