package router

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/galactic-cni/galactic/router/dataplane"
)

// ControlSocket is the unix socket `galactic-router drain` talks to: in the
// state dir, so only the node's root reaches it.
func ControlSocket(stateDir string) string { return filepath.Join(stateDir, "router", "control.sock") }

// ListenControl listens on the control socket. The socket is bound by its
// name from within its directory: a state dir path can be longer than a
// socket address may be.
func ListenControl(stateDir string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(ControlSocket(stateDir)), 0o700); err != nil {
		return nil, err
	}
	return inDir(filepath.Dir(ControlSocket(stateDir)), func() (net.Listener, error) {
		_ = os.Remove(filepath.Base(ControlSocket(stateDir)))
		return net.Listen("unix", filepath.Base(ControlSocket(stateDir)))
	})
}

// DialControl connects to the control socket, as ListenControl binds it.
func DialControl(stateDir string) (net.Conn, error) {
	c, err := inDir(filepath.Dir(ControlSocket(stateDir)), func() (net.Conn, error) {
		return net.Dial("unix", filepath.Base(ControlSocket(stateDir)))
	})
	if err != nil {
		// The caller tells "no router runs" by a dial error.
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: err}
	}
	return c, nil
}

func inDir[T any](dir string, f func() (T, error)) (T, error) {
	var zero T
	prev, err := os.Getwd()
	if err != nil {
		return zero, err
	}
	if err := os.Chdir(dir); err != nil {
		return zero, err
	}
	defer os.Chdir(prev)
	return f()
}

// ControlHandler serves POST /drain on the control socket.
func (d *Daemon) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/drain", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		if err := d.Drain(r.Context()); err != nil {
			http.Error(w, "drain: "+err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("drained\n"))
	})
	return mux
}

// Drain asks the running loop to drain and waits for it; Run returns
// after it.
func (d *Daemon) Drain(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case d.drainReq <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain re-announces every route this node announces with the drain
// marking, so receivers remove their kernel routes at once instead of
// holding them, then withdraws them all, removes everything the router
// installed in the kernel, forgets the saved paths and ends every session
// with a Cease.
func (d *Daemon) drain(ctx context.Context) error {
	marked, errs := d.exp.drain(ctx)
	errs = append(errs, d.kernel.remove(), d.exp.store.Forget())
	// Give the withdrawals a moment on the wire before the Cease.
	d.clock.Sleep(drainSpacing)
	errs = append(errs, d.spk.Stop(ctx))
	d.log.Info("drained", "marked", marked)
	return errors.Join(errs...)
}

// drain re-announces every path drained, then withdraws them all.
func (e *exportStage) drain(ctx context.Context) (marked int, errs []error) {
	for k, r := range e.announced {
		if r.Drained {
			continue
		}
		r.Drained = true
		if err := e.spk.Announce(ctx, r); err != nil {
			errs = append(errs, err)
			continue
		}
		e.announced[k] = r
		marked++
	}
	if marked > 0 {
		// The marking reaches receivers before the withdrawal would.
		e.clock.Sleep(drainSpacing)
	}
	for k := range e.announced {
		if err := e.spk.Withdraw(ctx, k); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(e.announced, k)
	}
	return marked, errs
}

// drainSpacing separates a drain's marking, withdrawals and Cease on the
// wire; a variable so unit tests need not wait.
var drainSpacing = 500 * time.Millisecond

// RemoveKernelState deletes every VXLAN device galactic-router made, with
// its routes, neighbours, FDB entries and rules.
func RemoveKernelState() error {
	devs, err := dataplane.Devices()
	if err != nil {
		return err
	}
	var errs []error
	for vpc := range devs {
		errs = append(errs, dataplane.Plane{}.RemoveVPC(vpc))
	}
	return errors.Join(errs...)
}
