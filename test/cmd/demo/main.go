// Command demo runs `make demo`: an attachment attached, upgraded, moved,
// crashed and reclaimed across two nodes, on one machine. Ctrl-C stops it
// and removes everything it created.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/galactic-cni/galactic/test/demo"
)

func main() {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (network namespaces, taps, policy routing): run `sudo make demo`")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
