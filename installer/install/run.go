package install

import (
	"context"
	"fmt"
	"time"
)

// Defaults for Run. The kubelet refreshes a projected token once 80% of its
// lifetime has passed (at least an hour by default), so a check every few
// seconds follows it closely, and minutes of failure still leave the
// previous token valid.
const (
	DefaultInterval = 10 * time.Second
	DefaultGrace    = 2 * time.Minute
)

// Run keeps the node kubeconfig, and the token copy it names, in step with
// their source (the service account token and CA, or --kubeconfig) until
// ctx ends, which returns nil. It returns an error once refreshing has
// failed for longer than grace: the plugins' credentials are about to go
// stale and the pod must say so.
func Run(ctx context.Context, o Options, interval, grace time.Duration) error {
	o = o.withDefaults()
	p, err := o.resolve()
	if err != nil {
		return err
	}
	if o.NodeTokenSeconds != 0 && o.NodeTokenSeconds < minTokenSeconds {
		return fmt.Errorf("--node-token-seconds %d: want 0 (use the pod's token) or at least %d", o.NodeTokenSeconds, minTokenSeconds)
	}
	if interval <= 0 || grace < interval {
		return fmt.Errorf("--interval (%s) must be positive and --grace (%s) at least as long", interval, grace)
	}
	out := o.out()
	source := o.TokenFile
	if o.SourceKubeconfig != "" {
		source = o.SourceKubeconfig
	}
	fmt.Fprintf(out, "run: keeping %s in step with %s, checking every %s\n", p.kubeconfig, source, interval)

	lastOK := time.Now()
	var failing error
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := o.refresh(p)
		switch {
		case err == nil:
			if failing != nil {
				fmt.Fprintf(out, "run: refreshed %s again\n", p.kubeconfig)
			}
			failing, lastOK = nil, time.Now()
		case time.Since(lastOK) > grace:
			return fmt.Errorf("cannot refresh %s for more than %s: %w", p.kubeconfig, grace, err)
		default:
			if failing == nil || failing.Error() != err.Error() {
				fmt.Fprintf(out, "run: cannot refresh %s, retrying for up to %s: %v\n", p.kubeconfig, grace, err)
			}
			failing = err
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "run: stopping")
			return nil
		case <-tick.C:
		}
	}
}

// refresh rewrites the credential files whose source changed. It never
// creates them: that is install's job, and a missing file means the node
// was uninstalled or never installed.
func (o Options) refresh(p paths) error {
	creds, err := o.buildCredentials(p)
	if err != nil {
		return err
	}
	for _, f := range credentialFiles(p, creds) {
		c, err := f.compare()
		if err != nil {
			return err
		}
		switch c {
		case create:
			return fmt.Errorf("%s does not exist: run `galactic-installer install` first", f.path)
		case update:
			if err := f.write(); err != nil {
				return err
			}
			fmt.Fprintf(o.out(), "update: %s (credentials changed at their source)\n", f.path)
		}
	}
	return nil
}
