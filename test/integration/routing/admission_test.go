package routing

import (
	"os"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/test/harness"
)

// Every harness node runs with its own node-bound token under the policy;
// this test walks the whole chain on purpose and checks that no component
// was refused along the way.
func TestTheWholeChainRunsUnderThePerNodePolicyWithNodeBoundTokens(t *testing.T) {
	env := harness.Setup(t)
	f := harness.NewFabric(t)
	a := f.NewRouted(t, env, "node-a")
	b := f.NewRouted(t, env, "node-b")
	web := harness.Attachment{VPC: "blue", Name: "chain-0", VNI: 10100, Addresses: []string{"10.20.0.40/24"}, Handoff: withHandoff}

	// ADD on node-a; node-a's router announces and writes the status.
	ca := a.Add(t, web)
	f.WaitPaths(t, 1, web.Prefixes()...)
	env.WaitCondition(t, web, "node-a", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)

	// The move with handoff: node-b's ADD waits for the lease until
	// node-a's DEL releases it.
	cb := harness.NewContainer(t)
	done := b.AddInBackground(t, web, cb)
	waitsFor(t, b.Node, web, a.HolderOf(ca))
	a.Del(t, web, ca)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	env.WaitCondition(t, web, "node-b", v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonAnnounced)
	if adv := env.Advertisement(t, web, "node-a"); adv != nil {
		t.Errorf("node-a's advertisement is still there after its DEL: %+v", adv.Spec)
	}
	if h := harness.LeaseHolder(env.Lease(t, names.Lease(web.VPC, web.Name))); !strings.HasPrefix(h, "node-b/") {
		t.Errorf("lease holder %q after the move, want node-b's", h)
	}

	// What DEL missed, the GC releases: a container on node-a gone without
	// a DEL leaves an advertisement and a lease held from node-a.
	job := harness.Attachment{VPC: "blue", Name: "chain-1", VNI: 10100, Addresses: []string{"10.20.0.41/24"}, Handoff: withHandoff}
	cj := a.Add(t, job)
	cj.Delete()
	gcOut := a.MustGC(t)
	if strings.Contains(gcOut, harness.AdmissionPolicy) {
		t.Errorf("galactic-gc was refused by the admission policy:\n%s", gcOut)
	}
	if adv := env.Advertisement(t, job, "node-a"); adv != nil {
		t.Errorf("the GC left the dead container's advertisement: %+v", adv.Spec)
	}
	if h := harness.LeaseHolder(env.Lease(t, names.Lease(job.VPC, job.Name))); h != "" {
		t.Errorf("the GC left the dead container's lease held by %q", h)
	}

	// DEL on node-b releases the last of it.
	b.Del(t, web, cb)
	f.WaitPaths(t, 0, web.Prefixes()...)

	for _, n := range []*harness.Routed{a, b} {
		logs := n.Router.Log()
		if data, err := os.ReadFile(n.Settings.LogFile); err == nil {
			logs += string(data)
		}
		if strings.Contains(logs, harness.AdmissionPolicy) {
			t.Errorf("%s: a component was refused by the admission policy:\n%s", n.Name, logs)
		}
	}
}
