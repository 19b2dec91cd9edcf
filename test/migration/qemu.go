package migration

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/test/harness"
	"github.com/galactic-cni/galactic/test/vm"
)

// QEMU is the VMM of a migration between two qemu processes: the source
// runs the guest with a QMP socket, the target is started on the standby
// tap with -incoming, and the guest's state goes over the fabric.
type QEMU struct {
	Assets *vm.GuestAssets
	Accel  string
	// MTU and MemoryMB are the source's: the target is the same machine.
	MTU, MemoryMB int
	// Source is the running guest; SourceQMP its QMP socket.
	Source    *vm.Guest
	SourceQMP string
	// TargetNode runs the incoming qemu, listening on TargetAddr:Port
	// (its fabric address); TargetQMP is its QMP socket.
	TargetNode *harness.Node
	TargetAddr netip.Addr
	Port       int
	TargetQMP  string
	// Timeout bounds the migration itself; default two minutes.
	Timeout time.Duration
	// Console, when set, also gets the target's serial console.
	Console io.Writer

	// Target is the incoming guest once StartTarget ran.
	Target              *vm.Guest
	sourceQMP, targetQM *vm.QMP
	// Status is qemu's account of the completed migration.
	Status vm.MigrationStatus
}

func (q *QEMU) uri() string { return fmt.Sprintf("tcp:%s:%d", q.TargetAddr, q.Port) }

// StartTarget starts the same machine on the standby tap, waiting for the
// guest's state.
func (q *QEMU) StartTarget(ctx context.Context, res *current.Result) error {
	o := vm.GuestOptions{Netns: q.TargetNode.Netns.Name, Accel: q.Accel, MTU: q.MTU, MemoryMB: q.MemoryMB, QMP: q.TargetQMP, Incoming: q.uri(), Console: q.Console}
	if err := o.FromResult(res); err != nil {
		return err
	}
	g, err := vm.StartGuest(q.Assets, o)
	if err != nil {
		return err
	}
	q.Target = g
	if q.targetQM, err = vm.DialQMP(q.TargetQMP, 30*time.Second); err != nil {
		return err
	}
	st, err := q.targetQM.Status()
	if err == nil && st != "inmigrate" {
		err = fmt.Errorf("the incoming qemu is %q, not waiting for a migration", st)
	}
	return err
}

// Migrate sends the guest and returns once qemu completed the migration:
// the source paused the guest for the last copy and stays paused.
func (q *QEMU) Migrate(ctx context.Context) (time.Duration, error) {
	var err error
	if q.sourceQMP == nil {
		if q.sourceQMP, err = vm.DialQMP(q.SourceQMP, 10*time.Second); err != nil {
			return 0, err
		}
	}
	timeout := q.Timeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	q.Status, err = q.sourceQMP.Migrate(q.uri(), timeout)
	if err != nil && q.Target != nil {
		err = fmt.Errorf("%w (the incoming qemu says: %s)", err, strings.TrimSpace(q.Target.Stderr()))
	}
	return time.Duration(q.Status.Downtime) * time.Millisecond, err
}

// ResumeTarget runs the guest on the target.
func (q *QEMU) ResumeTarget(ctx context.Context) error {
	_, err := q.targetQM.Execute("cont", nil)
	return err
}

// ResumeSource runs the guest again on the source.
func (q *QEMU) ResumeSource(ctx context.Context) error {
	var err error
	if q.sourceQMP == nil {
		if q.sourceQMP, err = vm.DialQMP(q.SourceQMP, 10*time.Second); err != nil {
			return err
		}
	}
	_, err = q.sourceQMP.Execute("cont", nil)
	return err
}

// StopSource ends the source qemu, which holds nothing of the guest any more.
func (q *QEMU) StopSource() error {
	if q.sourceQMP != nil {
		_, _ = q.sourceQMP.Execute("quit", nil)
		q.sourceQMP.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for !q.Source.Exited() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	q.Source.Kill()
	return nil
}

// StopTarget ends the incoming qemu of an aborted migration.
func (q *QEMU) StopTarget() {
	if q.targetQM != nil {
		q.targetQM.Close()
	}
	if q.Target != nil {
		q.Target.Kill()
	}
}

// Next is the migration back (or on): the guest running on this
// migration's target moves to targetNode, listening on addr, with its
// QMP socket at qmp.
func (q *QEMU) Next(targetNode *harness.Node, addr netip.Addr, qmp string) *QEMU {
	return &QEMU{
		Assets: q.Assets, Accel: q.Accel, MTU: q.MTU, MemoryMB: q.MemoryMB,
		Source: q.Target, SourceQMP: q.TargetQMP, sourceQMP: q.targetQM,
		TargetNode: targetNode, TargetAddr: addr, Port: q.Port, TargetQMP: qmp,
		Timeout: q.Timeout, Console: q.Console,
	}
}
