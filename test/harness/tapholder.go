package harness

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// HoldTap starts the tapholder helper inside the node, attached to the tap
// called name as a VMM would be, and returns once it is attached. stop
// kills it and waits for it to exit, so the tap is free when stop returns;
// t's cleanup stops it too.
func (n *Node) HoldTap(t testing.TB, name string) (stop func()) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.Netns.Name, filepath.Join(n.env.BinDir, "tapholder"), name)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting tapholder: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		stop()
		t.Fatalf("tapholder %s did not attach: %q %v %s", name, line, err, stderr.String())
	}
	return stop
}
