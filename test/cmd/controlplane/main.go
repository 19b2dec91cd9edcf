// Command controlplane runs the test harness's real etcd and kube-apiserver
// in the foreground, with the galactic CRDs installed, and writes an admin
// kubeconfig. Ctrl-C stops both and removes their data.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/galactic-cni/galactic/test/harness"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "galactic.kubeconfig", "where to write the admin kubeconfig")
	flag.Parse()
	ctx, stop, out := harness.SignalContext()
	defer stop()
	cp, err := harness.StartControlPlane(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
	defer cp.Stop()
	data, err := os.ReadFile(cp.AdminKubeconfig)
	if err == nil {
		err = os.WriteFile(*kubeconfig, data, 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane: writing kubeconfig:", err)
		return
	}
	fmt.Fprintf(out, "kube-apiserver ready at %s\nkubeconfig: %s (try: kubectl --kubeconfig %s get bgpadvertisements -A)\nCtrl-C to stop.\n", cp.Server, *kubeconfig, *kubeconfig)
	<-ctx.Done()
}
