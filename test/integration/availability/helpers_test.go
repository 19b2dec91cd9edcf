package availability

import (
	"context"
	"fmt"
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

var seq int

// newAttachment is the attachment of one test (tap, table routing, handoff
// on, galactic-bgp announcing only while available), with an address of
// its own so that tests never overlap on a node. Its ADD waits up to
// waitSeconds for its lease, which lasts leaseSeconds, and deletes its
// lease and advertisements afterwards (the API server is shared by the
// package).
func newAttachment(t *testing.T, env *harness.Env, name string, waitSeconds, leaseSeconds int) harness.Attachment {
	t.Helper()
	seq++
	env.ForgetAttachment(t, vpc, name)
	return harness.Attachment{VPC: vpc, Name: name, Mode: "tap",
		Addresses: []string{fmt.Sprintf("10.50.%d.5/24", seq)}, VNI: 10500, Announce: "whenAvailable",
		Handoff: &harness.Handoff{WaitSeconds: waitSeconds, LeaseSeconds: leaseSeconds}}
}

// checkAvailability checks what handoff.Availability says of holder and
// token on the lease as it is now, and returns the lease.
func checkAvailability(t *testing.T, env *harness.Env, a harness.Attachment, holder string, token int64, status metav1.ConditionStatus, reason string) *coordinationv1.Lease {
	t.Helper()
	l := env.Lease(t, a.LeaseName())
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

// reported is one run of the availability command.
type reported struct {
	code           int
	stdout, stderr string
}

// report runs `galactic-cni <verb> ...` for container c inside node, as a
// runtime on the node would, with the node's settings and extraEnv.
func report(t *testing.T, a harness.Attachment, node *harness.Node, verb string, c *harness.Netns, extraEnv []string, args ...string) reported {
	t.Helper()
	r, err := node.GalacticCNIWith(extraEnv, verb, append([]string{"--vpc", vpc, "--attachment", a.Name, "--container", harness.ContainerID(c.Path)}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return reported{code: r.Code, stdout: r.Stdout, stderr: r.Stderr}
}

// mustReport runs the command and fails unless it exits with code.
func mustReport(t *testing.T, a harness.Attachment, node *harness.Node, verb string, c *harness.Netns, code int, args ...string) reported {
	t.Helper()
	r := report(t, a, node, verb, c, nil, args...)
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
