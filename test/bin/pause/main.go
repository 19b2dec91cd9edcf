// Command pause is the process of the CRI tests' sandbox image: as the
// infra container's PID 1 it holds the pod's namespaces, reaps the
// children that are reparented to it and exits on SIGINT or SIGTERM. Built
// static (CGO_ENABLED=0) it is the image's only file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every exited child; one SIGCHLD may stand for several.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
