package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the leader election Lease in the controller's namespace.
const LeaseName = "galactic-controller"

// Election configures leader election among the controller's replicas.
type Election struct {
	// Config reaches the API server.
	Config *rest.Config
	// Namespace holds the Lease; Identity is this replica's holder identity.
	Namespace, Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's: a
	// standby takes over at most LeaseDuration after it last saw the
	// leader renew, plus its retry interval.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// ErrLostLeadership ends a leader that could not renew its lease: another
// replica may lead now, so this one must stop reconciling at once.
var ErrLostLeadership = errors.New("lost the leader election lease")

// RunElected starts the informers, then competes for the lease and leads
// while it holds it. It returns nil when ctx ends (releasing the lease, so
// a standby takes over without waiting for it to expire) and
// ErrLostLeadership when leadership is lost. health, set before it
// returns, is the check /healthz serves.
func (c *Controller) RunElected(ctx context.Context, e Election, health *leaderelection.HealthzAdaptor) error {
	cl, err := v1.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("leader election client: %w", err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: LeaseName},
		Client:     cl,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	led := make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.LeaseDuration,
		RenewDeadline:   e.RenewDeadline,
		RetryPeriod:     e.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            LeaseName,
		WatchDog:        health,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				c.log.Info("became the leader")
				defer close(led)
				c.Lead(ctx)
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if id != e.Identity {
					c.log.Info("standing by", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	c.Start(ctx)
	le.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	// Run returns once renewing failed; the workers stop with its context.
	select {
	case <-led:
	case <-time.After(5 * time.Second):
	}
	return ErrLostLeadership
}
