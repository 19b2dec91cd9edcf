package filter

import "net/netip"

// Off returns a filter that does nothing: the reference the benchmark
// measures galactic-cni's ADD and DEL against (test/bench builds a
// galactic-cni that chooses it). Nothing a node's configuration, a CNI
// config or a workload controls selects it; galactic's binaries
// construct the kernel's filter.
func Off() Filter { return off{} }

type off struct{}

func (off) Add(Attachment, ...Attachment) error                   { return nil }
func (off) StartAdd(Attachment, ...Attachment) Adding             { return offAdding{} }
func (off) Remove(string, ...Attachment) error                    { return nil }
func (off) StartRemove(string, ...Attachment) (wait func() error) { return func() error { return nil } }
func (off) Check(Attachment) error                                { return nil }
func (off) Sync([]Attachment) (SyncResult, error)                 { return SyncResult{}, nil }
func (off) SetVTEPs([]netip.Addr) (SyncResult, error)             { return SyncResult{}, nil }
func (off) Ensure() (bool, error)                                 { return false, nil }
func (off) Delete() error                                         { return nil }

type offAdding struct{}

func (offAdding) Attach(int)       {}
func (offAdding) Finish(int) error { return nil }
func (offAdding) Wait() error      { return nil }
