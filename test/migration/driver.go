// Package migration is the reference sequence of a live migration as a
// runtime drives it over galactic (docs/concepts/live-migration.md): the steps,
// their order, and what to do when one fails. The integration tests, the
// benchmark and the demo run it; a runtime's authors can read Run as the
// recipe.
package migration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/galactic-cni/galactic/pkg/netconf"
	"github.com/galactic-cni/galactic/test/harness"
)

// Exit codes of release and promote a runtime acts on.
const (
	ExitOK = 0
	// ExitStale: the lease moved on from the source's token.
	ExitStale = 5
	// ExitHeld: promote gave up on a live holder after waitSeconds.
	ExitHeld = 6
)

// StandbyCapArgs is the CNI capability argument a CRI runtime passes for a
// pod annotated as a migration target (cnitool reads it from CAP_ARGS).
var StandbyCapArgs = func() string {
	b, _ := json.Marshal(map[string]any{netconf.CapabilityPodAnnotations: map[string]string{netconf.AnnotationStandby: "true"}})
	return string(b)
}()

// Side is one end of a migration: a node and the container (pod sandbox)
// that holds, or will hold, the attachment there.
type Side struct {
	Node      *harness.Node
	Container *harness.Netns
}

// VMM is what the driver asks of the VMMs on both sides. A nil VMM (no
// guest, as in the plugin-level tests) skips these steps.
type VMM interface {
	// StartTarget starts the incoming VMM on the standby interface the
	// target's ADD built; it waits for the state and does not run.
	StartTarget(ctx context.Context, res *current.Result) error
	// Migrate sends the guest to the target and returns once the source
	// has paused it for the last copy and the target has the whole state.
	// Downtime is the VMM's own measure of the pause, if it has one.
	Migrate(ctx context.Context) (downtime time.Duration, err error)
	// ResumeTarget runs the guest on the target; ResumeSource runs it
	// again on the source after a failed switchover.
	ResumeTarget(ctx context.Context) error
	ResumeSource(ctx context.Context) error
	// StopSource ends the source VMM once the target runs; StopTarget
	// ends the target VMM of an aborted migration.
	StopSource() error
	StopTarget()
}

// Migration moves one attachment's instance from Source to Target.
type Migration struct {
	// Namespace and Attachment name a VPCAttachment; VPC and Attachment
	// an inline attachment.
	Namespace, VPC, Attachment string
	// Network is the conflist name on both nodes; IfName is CNI_IFNAME.
	Network, IfName string
	Source, Target  Side
	VMM             VMM
	// AfterStandby, when set, runs once the standby ADD returned, and
	// BeforePromote between release and promote: tests observe the
	// standby interface from one to the other, or lose the target at the
	// worst moment.
	AfterStandby, BeforePromote func() error
}

// Timings are when each step returned.
type Timings struct {
	Start, Standby, Migrated, Released, Promoted, Resumed, SourceDeleted time.Time
	// QEMUDowntime is the VMM's own measure of the pause.
	QEMUDowntime time.Duration
}

// Result says how a migration ended.
type Result struct {
	Timings Timings
	// Promoted is the target's promote, SourcePromote the source's when it
	// took the attachment back.
	Promote, SourcePromote harness.Command
	// FellBack is true when the target failed after the release and the
	// source promoted itself back and resumed.
	FellBack bool
}

func (m *Migration) flags(s Side) []string {
	named := []string{"--vpc", m.VPC}
	if m.Namespace != "" {
		named = []string{"--namespace", m.Namespace}
	}
	return append(named, "--attachment", m.Attachment, "--container", harness.ContainerID(s.Container.Path), "--ifname", m.IfName)
}

// Run performs the migration:
//
//  1. standby ADD on the target (the pod annotation network.galactic.dev/standby),
//  2. the incoming VMM opens the standby interface,
//  3. migrate: the source VMM sends the guest and pauses it at the end,
//  4. release on the source (the lease goes; its route stays announced),
//  5. promote on the target (new token; receivers switch to it),
//  6. resume the guest on the target,
//  7. stop the source VMM and DEL the source.
//
// Before step 4 a failure aborts: the target's VMM stops and its DEL
// removes the standby interface; the source never stopped holding. After
// step 4 a failed promote makes the source promote itself back (a new
// token) and resume. The error says what failed; Result says how it ended.
func (m *Migration) Run(ctx context.Context) (Result, error) {
	var r Result
	t := &r.Timings
	t.Start = time.Now()
	out, err := m.Target.Node.CNITool("add", m.Network, m.Target.Container, m.IfName, "CAP_ARGS="+StandbyCapArgs)
	if err != nil {
		return r, fmt.Errorf("standby ADD on %s: %w", m.Target.Node.Name, err)
	}
	t.Standby = time.Now()
	abort := func(cause error) (Result, error) {
		if m.VMM != nil {
			m.VMM.StopTarget()
		}
		if _, err := m.Target.Node.CNITool("del", m.Network, m.Target.Container, m.IfName); err != nil {
			cause = errors.Join(cause, fmt.Errorf("DEL of the standby target: %w", err))
		}
		return r, cause
	}
	if m.AfterStandby != nil {
		if err := m.AfterStandby(); err != nil {
			return abort(fmt.Errorf("after the standby ADD: %w", err))
		}
	}
	if m.VMM != nil {
		res := &current.Result{}
		if err := json.Unmarshal([]byte(out), res); err != nil {
			return abort(fmt.Errorf("the standby ADD's result: %w", err))
		}
		if err := m.VMM.StartTarget(ctx, res); err != nil {
			return abort(fmt.Errorf("starting the incoming VMM: %w", err))
		}
		if r.Timings.QEMUDowntime, err = m.VMM.Migrate(ctx); err != nil {
			return abort(fmt.Errorf("migrating: %w", err))
		}
	}
	t.Migrated = time.Now()

	rel, err := m.Source.Node.GalacticCNI("release", m.flags(m.Source)...)
	if err == nil && rel.Code != ExitOK {
		err = fmt.Errorf("release on %s: %s", m.Source.Node.Name, rel)
	}
	if err != nil {
		if m.VMM != nil {
			err = errors.Join(err, m.VMM.ResumeSource(ctx))
		}
		return abort(err)
	}
	t.Released = time.Now()

	if m.BeforePromote != nil {
		if err := m.BeforePromote(); err != nil {
			return r, m.fallBack(ctx, &r, fmt.Errorf("before promote: %w", err))
		}
	}
	r.Promote, err = m.Target.Node.GalacticCNI("promote", m.flags(m.Target)...)
	if err == nil && r.Promote.Code != ExitOK {
		err = fmt.Errorf("promote on %s: %s", m.Target.Node.Name, r.Promote)
	}
	if err != nil {
		return r, m.fallBack(ctx, &r, err)
	}
	t.Promoted = time.Now()
	if m.VMM != nil {
		if err := m.VMM.ResumeTarget(ctx); err != nil {
			return r, fmt.Errorf("resuming on the target (it holds the attachment now): %w", err)
		}
	}
	t.Resumed = time.Now()
	if m.VMM != nil {
		if err := m.VMM.StopSource(); err != nil {
			return r, fmt.Errorf("stopping the source VMM: %w", err)
		}
	}
	if _, err := m.Source.Node.CNITool("del", m.Network, m.Source.Container, m.IfName); err != nil {
		return r, fmt.Errorf("source DEL: %w", err)
	}
	t.SourceDeleted = time.Now()
	return r, nil
}

// fallBack gives the attachment back to the source after its release: the
// target's VMM stops and its DEL removes what it built (it may never have
// been promoted), then the source promotes itself with a new token and
// resumes. cause is why; the error is nil only if the source serves again.
func (m *Migration) fallBack(ctx context.Context, r *Result, cause error) error {
	r.FellBack = true
	if m.VMM != nil {
		m.VMM.StopTarget()
	}
	errs := []error{cause}
	if _, err := m.Target.Node.CNITool("del", m.Network, m.Target.Container, m.IfName); err != nil {
		errs = append(errs, fmt.Errorf("DEL of the target: %w", err))
	}
	var err error
	r.SourcePromote, err = m.Source.Node.GalacticCNI("promote", m.flags(m.Source)...)
	if err == nil && r.SourcePromote.Code != ExitOK {
		err = fmt.Errorf("the source's promote on %s: %s", m.Source.Node.Name, r.SourcePromote)
	}
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if m.VMM != nil {
		if err := m.VMM.ResumeSource(ctx); err != nil {
			return errors.Join(append(errs, fmt.Errorf("resuming the source: %w", err))...)
		}
	}
	return errors.Join(errs...)
}
