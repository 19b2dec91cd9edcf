package harness

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// HoldTap starts the tapholder helper inside the node, attached to the tap
// called name as a VMM would be, and returns once it is attached. stop
// kills it and waits for it to exit, so the tap is free when stop returns;
// t's cleanup stops it too.
func (n *Node) HoldTap(t testing.TB, name string) (stop func()) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.Netns.Name, filepath.Join(n.env.BinDir, "tapholder"), name)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = w, &stderr
	p, err := StartProcess("tapholder", cmd, "")
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	stop = p.Kill
	t.Cleanup(stop)
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		stop()
		t.Fatalf("tapholder %s did not attach: %q %v %s", name, line, err, stderr.String())
	}
	return stop
}
