package availability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

const (
	vpc    = "av"
	ifName = "net0"
	// hangGuard bounds waits that only end when something happens, so a
	// broken build fails instead of hanging; it is never a speed limit.
	hangGuard = 2 * time.Minute
)

// Exit codes of galactic-cni available|unavailable (docs/concepts/handoff-and-availability.md).
const (
	exitOK        = 0
	exitNoRecord  = 3
	exitNotHolder = 4
	exitStale     = 5
)

// attachment is one VPC attachment under test, with its own address so
// that tests never overlap on a node.
type attachment struct {
	env     *harness.Env
	name    string
	address string
}

var seq int

// newAttachment names an attachment for one test and deletes its lease and
// advertisements afterwards (the API server is shared by the package).
func newAttachment(t *testing.T, env *harness.Env, name string) attachment {
	t.Helper()
	seq++
	a := attachment{env: env, name: name, address: fmt.Sprintf("10.50.%d.5/24", seq)}
	env.ForgetAttachment(t, vpc, name)
	return a
}

func (a attachment) network() string { return "net-" + a.name }

func (a attachment) leaseName() string { return names.Lease(vpc, a.name) }

// install writes the attachment's chain on node: galactic-cni (tap, table
// routing, handoff on) then galactic-bgp announcing only while available.
func (a attachment) install(t *testing.T, node *harness.Node, waitSeconds, leaseSeconds int) {
	t.Helper()
	node.WriteConflist(t, map[string]any{
		"cniVersion": "1.1.0", "name": a.network(),
		"plugins": []any{
			map[string]any{"type": "galactic-cni", "vpc": vpc, "attachment": a.name, "mode": "tap", "routing": "table",
				"addresses": []string{a.address},
				"handoff":   map[string]any{"enabled": true, "waitSeconds": waitSeconds, "leaseSeconds": leaseSeconds}},
			map[string]any{"type": "galactic-bgp", "vpc": vpc, "attachment": a.name, "vni": 10500, "announce": "whenAvailable"},
		},
	})
}

func (a attachment) add(t *testing.T, node *harness.Node, c *harness.Netns) {
	t.Helper()
	if _, err := node.CNITool("add", a.network(), c, ifName); err != nil {
		t.Fatalf("ADD on %s: %v", node.Name, err)
	}
}

// addInBackground starts an ADD that may wait for the lease.
func (a attachment) addInBackground(node *harness.Node, c *harness.Netns) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := node.CNITool("add", a.network(), c, ifName)
		done <- err
	}()
	return done
}

func (a attachment) del(t *testing.T, node *harness.Node, c *harness.Netns) {
	t.Helper()
	if _, err := node.CNITool("del", a.network(), c, ifName); err != nil {
		t.Fatalf("DEL on %s: %v", node.Name, err)
	}
}

// checkAvailability checks what handoff.Availability says of holder and
// token on the lease as it is now, and returns the lease.
func (a attachment) checkAvailability(t *testing.T, holder string, token int64, status metav1.ConditionStatus, reason string) *coordinationv1.Lease {
	t.Helper()
	l := a.lease(t)
	if s, r, msg := handoff.Availability(l, holder, token); s != status || r != reason {
		t.Fatalf("availability of %s (token %d): want %s %s, got %s %s (%s); lease annotations %v",
			holder, token, status, reason, s, r, msg, l.GetAnnotations())
	}
	return l
}

// checkReset checks that the lease carries a not-available report under
// token with reason, as written by an acquisition or a release.
func checkReset(t *testing.T, l *coordinationv1.Lease, token int64, reason string) {
	t.Helper()
	want := map[string]string{
		handoff.AnnotationAvailable:       "false",
		handoff.AnnotationAvailableToken:  fmt.Sprint(token),
		handoff.AnnotationAvailableReason: reason,
	}
	for k, v := range want {
		if l.Annotations[k] != v {
			t.Errorf("lease annotation %s = %q, want %q (all: %v)", k, l.Annotations[k], v, l.Annotations)
		}
	}
}

func holderOf(node *harness.Node, c *harness.Netns) string {
	return names.Holder(node.Name, harness.ContainerID(c.Path))
}

// reported is one run of the availability command.
type reported struct {
	code           int
	stdout, stderr string
}

// report runs `galactic-cni <verb> ...` for container c inside node, as a
// runtime on the node would, with the node's settings and extraEnv.
func (a attachment) report(t *testing.T, node *harness.Node, verb string, c *harness.Netns, extraEnv []string, args ...string) reported {
	t.Helper()
	argv := append([]string{"netns", "exec", node.Netns.Name, filepath.Join(a.env.BinDir, "galactic-cni"), verb,
		"--vpc", vpc, "--attachment", a.name, "--container", harness.ContainerID(c.Path)}, args...)
	cmd := exec.Command("ip", argv...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CNI_") })
	cmd.Env = append(append(cmd.Env, node.Environ()...), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := reported{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("running galactic-cni %s: %v", verb, err)
	}
	return r
}

// mustReport runs the command and fails unless it exits with code.
func (a attachment) mustReport(t *testing.T, node *harness.Node, verb string, c *harness.Netns, code int, args ...string) reported {
	t.Helper()
	r := a.report(t, node, verb, c, nil, args...)
	if r.code != code {
		t.Fatalf("galactic-cni %s on %s: exit %d, want %d\nstdout: %s\nstderr: %s", verb, node.Name, r.code, code, r.stdout, r.stderr)
	}
	if code == exitOK && (strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, "reported "+verb)) {
		t.Errorf("galactic-cni %s: want one line saying what was reported, got %q", verb, r.stdout)
	}
	if code != exitOK && r.stdout != "" {
		t.Errorf("galactic-cni %s failed but printed %q", verb, r.stdout)
	}
	return r
}

// heldOn lists the names of the leases labelled as held on node.
func heldOn(t *testing.T, env *harness.Env, node string) []string {
	t.Helper()
	list, err := env.API.Leases(harness.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: names.HolderNodeSelector(node)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range list.Items {
		out = append(out, l.Name)
	}
	return out
}

// waitDone waits for a background ADD.
func waitDone(t *testing.T, what string, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(hangGuard):
		t.Fatalf("%s did not finish", what)
	}
}

// lease returns the attachment's lease, nil when there is none.
func (a attachment) lease(t *testing.T) *coordinationv1.Lease {
	t.Helper()
	return a.env.Lease(t, a.leaseName())
}
