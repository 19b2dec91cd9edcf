package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// StartController runs galactic-controller against the environment's API
// server, once per test binary, under its own service account and the
// RBAC of installer/manifests: the tests whose VPCs and attachments the
// control plane allocates, as it does on a cluster. It runs until the
// environment closes; every test that calls it shares it.
func (e *Env) StartController(t testing.TB) *Controller {
	t.Helper()
	c, err := e.EnsureController()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// EnsureController is StartController outside a test: it starts the
// environment's controller unless it runs, and says why it does not.
func (e *Env) EnsureController() (*Controller, error) {
	e.ctrlOnce.Do(func() { e.ctrl, e.ctrlErr = e.startController() })
	if e.ctrlErr != nil {
		return nil, fmt.Errorf("galactic-controller: %v", e.ctrlErr)
	}
	if e.ctrl.Exited() {
		return nil, fmt.Errorf("galactic-controller exited:\n%s", e.ctrl.LogTail(30))
	}
	return e.ctrl, nil
}

func (e *Env) startController() (*Controller, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := ApplyControllerManifests(ctx, e.CP); err != nil {
		return nil, err
	}
	kc := filepath.Join(e.BinDir, "controller.kubeconfig")
	if err := ServiceAccountKubeconfig(ctx, e.CP, Namespace, ControllerServiceAccount, kc); err != nil {
		return nil, err
	}
	// One replica: it leads at once, there being no lease to wait out.
	c, err := NewController(filepath.Join(e.BinDir, "galactic-controller"), kc, e.BinDir, "controller-0")
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	for {
		if v, ok, _ := c.Metric("galactic_controller_leader"); ok && v == 1 {
			return c, nil
		}
		if c.Exited() || ctx.Err() != nil {
			c.Kill()
			return nil, fmt.Errorf("galactic-controller does not lead:\n%s", c.LogTail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopController ends the controller StartController started, if any.
func (e *Env) stopController() {
	if e.ctrl != nil {
		e.ctrl.Terminate()
	}
}
