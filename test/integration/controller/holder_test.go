package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
	"github.com/galactic-cni/galactic/test/harness"
)

// shown is what one version of the attachment's status says.
type shown struct {
	node       string
	generation int64
	available  metav1.ConditionStatus
	reason     string
}

func (s shown) String() string {
	return fmt.Sprintf("holder=%s@%d HolderAvailable=%s/%s", s.node, s.generation, s.available, s.reason)
}

func shownBy(a *v1alpha1.VPCAttachment) shown {
	var s shown
	if a.Status.Holder != nil {
		s.node, s.generation = a.Status.Holder.Node, a.Status.Holder.Generation
	}
	if c := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionHolderAvailable); c != nil {
		s.available, s.reason = c.Status, c.Reason
	}
	return s
}

func TestHolderAndHolderAvailableFollowTheLeaseAndNeverShowAPredecessorsAnswer(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	ns := f.tenant(t, "holder")
	f.createVPC(t, vpcObject(ns, "blue", "10.20.0.0/16"))
	f.waitVPC(t, ns, "blue", readyVPC)
	f.createAttachment(t, attachmentObject(ns, "vm", "blue"))
	att := f.waitAttachment(t, ns, "vm", readyAttachment)

	// Every version of the status, as a watcher sees it.
	w, err := f.api.VPCAttachments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=vm", ResourceVersion: att.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var history []shown
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if a, ok := ev.Object.(*v1alpha1.VPCAttachment); ok && ev.Type != watch.Error {
				mu.Lock()
				history = append(history, shownBy(a))
				mu.Unlock()
			}
		}
	}()

	expect := func(want shown) {
		t.Helper()
		f.waitAttachment(t, ns, "vm", func(a *v1alpha1.VPCAttachment) error {
			if got := shownBy(a); got != want {
				return fmt.Errorf("shows %s, want %s", got, want)
			}
			return nil
		})
		t.Logf("shows %s", want)
	}
	lock := f.attachmentLock(t, att)
	expect(shown{"", 0, metav1.ConditionFalse, v1alpha1.ReasonNoHolder})

	a, err := lock.Acquire(ctx, "node-a/c1")
	if err != nil {
		t.Fatal(err)
	}
	expect(shown{"node-a", a.Token, metav1.ConditionFalse, handoff.ReasonAcquired})
	if err := lock.SetAvailable(ctx, a.Holder, a.Token, true, ""); err != nil {
		t.Fatal(err)
	}
	expect(shown{"node-a", a.Token, metav1.ConditionTrue, handoff.ReasonAvailable})
	if err := lock.SetAvailable(ctx, a.Holder, a.Token, false, "ShuttingDown"); err != nil {
		t.Fatal(err)
	}
	expect(shown{"node-a", a.Token, metav1.ConditionFalse, "ShuttingDown"})
	if err := lock.SetAvailable(ctx, a.Holder, a.Token, true, ""); err != nil {
		t.Fatal(err)
	}
	expect(shown{"node-a", a.Token, metav1.ConditionTrue, handoff.ReasonAvailable})
	if err := lock.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	expect(shown{"", 0, metav1.ConditionFalse, v1alpha1.ReasonNoHolder})

	// The successor starts unavailable, whatever its predecessor said.
	b, err := lock.Acquire(ctx, "node-b/c2")
	if err != nil {
		t.Fatal(err)
	}
	expect(shown{"node-b", b.Token, metav1.ConditionFalse, handoff.ReasonAcquired})
	if err := lock.SetAvailable(ctx, b.Holder, b.Token, true, "Booted"); err != nil {
		t.Fatal(err)
	}
	expect(shown{"node-b", b.Token, metav1.ConditionTrue, "Booted"})

	// The lease deleted: no holder.
	leases := f.kube.CoordinationV1().Leases(harness.Namespace)
	l, err := leases.List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelAttachmentUID + "=" + string(att.UID)})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("the attachment's lease: %v %v", l, err)
	}
	if err := leases.Delete(ctx, l.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect(shown{"", 0, metav1.ConditionFalse, v1alpha1.ReasonNoHolder})

	w.Stop()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for _, s := range history {
		if s.node == "node-b" && s.available == metav1.ConditionTrue && s.reason != "Booted" {
			t.Errorf("node-b was shown available with a report it never made: %s", s)
		}
		if s.available == metav1.ConditionTrue && s.node == "" {
			t.Errorf("available without a holder: %s", s)
		}
	}
	t.Logf("%d status versions, none showing a predecessor's answer", len(history))
}
