package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
)

func TestTwoTenantsEachGetTheirOwnVPCBlueAndAttachmentWeb(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	tenants := []string{f.tenant(t, "tenant-a"), f.tenant(t, "tenant-b")}
	for _, ns := range tenants {
		f.createVPC(t, vpcObject(ns, "blue", "10.20.0.0/16", "fd20::/48"))
		f.createAttachment(t, attachmentObject(ns, "web", "blue"))
	}
	vnis := map[int32]string{}
	planes := map[string]string{}
	nets := []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd20::/48")}
	for _, ns := range tenants {
		vpc := f.waitVPC(t, ns, "blue", readyVPC)
		if other, dup := vnis[vpc.Status.VNI]; dup || vpc.Status.VNI == 0 {
			t.Errorf("VPC %s/blue has VNI %d, which %s has too", ns, vpc.Status.VNI, other)
		}
		vnis[vpc.Status.VNI] = ns
		planes[vpc.Status.DataplaneName] = ns
		if !slices.Contains(vpc.Finalizers, v1alpha1.FinalizerVPC) {
			t.Errorf("VPC %s/blue has no protection finalizer: %v", ns, vpc.Finalizers)
		}
		vni, err := f.api.VNIs().Get(ctx, names.VNIName(vpc.Status.VNI), metav1.GetOptions{})
		if err != nil || vni.Spec.VPCUID != vpc.UID || vni.Spec.Namespace != ns {
			t.Errorf("the VNI object of %d: %+v, %v", vpc.Status.VNI, vni, err)
		}

		att := f.waitAttachment(t, ns, "web", readyAttachment)
		if att.Status.VNI != vpc.Status.VNI {
			t.Errorf("%s/web has VNI %d, its VPC %d", ns, att.Status.VNI, vpc.Status.VNI)
		}
		if len(att.Status.Addresses) != 2 {
			t.Fatalf("%s/web addresses %v, want one per family", ns, att.Status.Addresses)
		}
		for i, p := range att.Status.Addresses {
			pp := netip.MustParsePrefix(string(p))
			if pp.Bits() != nets[i].Bits() || !nets[i].Contains(pp.Addr()) {
				t.Errorf("%s/web address %s is not in %s with its prefix length", ns, p, nets[i])
			}
			a, err := f.api.VPCAddresses(ns).Get(ctx, names.VPCAddressName("blue", pp.Addr()), metav1.GetOptions{})
			if err != nil || a.Spec.AttachmentUID != att.UID || a.Spec.State != v1alpha1.AddressBound || a.Spec.VPCUID != vpc.UID {
				t.Errorf("the VPCAddress of %s: %+v, %v", pp.Addr(), a, err)
			}
		}
		if att.Status.Dataplane == nil || att.Status.Dataplane.VPC != vpc.Status.DataplaneName || att.Status.Dataplane.Attachment != names.DataplaneName("web", string(att.UID)) {
			t.Errorf("%s/web data-plane names %+v", ns, att.Status.Dataplane)
		}
		if err := condition(att.Status.Conditions, v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonNotAttached); err != nil {
			t.Error(err)
		}
		if err := condition(att.Status.Conditions, v1alpha1.ConditionHolderAvailable, metav1.ConditionFalse, v1alpha1.ReasonNoHolder); err != nil {
			t.Error(err)
		}
		if att.Status.Holder != nil {
			t.Errorf("%s/web holder %+v, want none", ns, att.Status.Holder)
		}
	}
	if len(vnis) != 2 || len(planes) != 2 {
		t.Errorf("the tenants' VPCs share a VNI or a data-plane name: %v %v", vnis, planes)
	}

	out, err := f.c.Kubectl(ctx, "get", "vpcattachments", "-A")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl get vpcattachments -A:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAMESPACE NAME VPC ADDRESSES HOLDER READY PROGRAMMED HOLDERAVAILABLE AGE" {
		t.Errorf("columns: %v", got)
	}
	for _, ns := range tenants {
		if !strings.Contains(string(out), ns) {
			t.Errorf("no row of %s", ns)
		}
	}
	out, err = f.c.Kubectl(ctx, "get", "vpcs,vpcaddresses", "-n", "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl get vpcs,vpcaddresses -n tenant-a:\n%s", out)
}

func TestEveryAttachmentOfABurstGetsItsOwnAddressWhileTheLeaderIsKilled(t *testing.T) {
	f := setup(t)
	defer f.ensureBoth(t)
	ctx := context.Background()
	ns := f.tenant(t, "burst")
	f.createVPC(t, vpcObject(ns, "blue", "10.30.0.0/16"))
	f.waitVPC(t, ns, "blue", readyVPC)
	leader, err := f.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}

	const n, killAt = 200, 100
	var created sync.WaitGroup
	created.Add(killAt)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				_, err := f.api.VPCAttachments(ns).Create(ctx, attachmentObject(ns, fmt.Sprintf("vm-%03d", i), "blue"), metav1.CreateOptions{})
				if err != nil {
					errs <- err
				}
				if i < killAt {
					created.Done()
				}
			}
		})
	}
	killed := make(chan time.Time, 1)
	go func() {
		created.Wait()
		leader.Kill()
		killed <- time.Now()
	}()
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("creating attachments: %v", err)
	}
	at := <-killed
	t.Logf("killed leader %s after %d creates", leader.Identity, killAt)

	waitObject(t, 3*time.Minute, "every attachment Ready", func() (*v1alpha1.VPCAttachmentList, error) {
		return f.api.VPCAttachments(ns).List(ctx, metav1.ListOptions{})
	}, func(l *v1alpha1.VPCAttachmentList) error {
		var notReady []string
		for i := range l.Items {
			if readyAttachment(&l.Items[i]) != nil {
				notReady = append(notReady, l.Items[i].Name)
			}
		}
		if len(l.Items) != n || len(notReady) > 0 {
			return fmt.Errorf("%d attachments, not Ready: %v", len(l.Items), notReady)
		}
		return nil
	})
	newLeader, err := f.leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if newLeader == leader {
		t.Fatalf("%s still leads after its SIGKILL", leader.Identity)
	}
	t.Logf("all %d Ready %s after the kill; %s leads", n, time.Since(at).Round(time.Millisecond), newLeader.Identity)

	// Checked against the API: one VPCAddress per attachment, named by
	// its address and bound to its UID; no address twice.
	atts, err := f.api.VPCAttachments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := f.api.VPCAddresses(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]v1alpha1.VPCAddress{}
	for _, a := range addrs.Items {
		byName[a.Name] = a
	}
	owner := map[netip.Addr]string{}
	for _, a := range atts.Items {
		if len(a.Status.Addresses) != 1 {
			t.Errorf("%s: addresses %v, want one", a.Name, a.Status.Addresses)
			continue
		}
		p := netip.MustParsePrefix(string(a.Status.Addresses[0]))
		if prev, dup := owner[p.Addr()]; dup {
			t.Errorf("%s has %s, which %s has too", a.Name, p.Addr(), prev)
		}
		owner[p.Addr()] = a.Name
		obj, ok := byName[names.VPCAddressName("blue", p.Addr())]
		if !ok || obj.Spec.AttachmentUID != a.UID || obj.Spec.Attachment != a.Name {
			t.Errorf("%s: the VPCAddress of %s is %+v", a.Name, p.Addr(), obj.Spec)
		}
	}
	if len(addrs.Items) != n {
		t.Errorf("%d VPCAddress objects for %d attachments: a claim was left over", len(addrs.Items), n)
	}
	for _, c := range f.ctrls {
		if c == leader {
			continue
		}
		if v, _, _ := c.Metric(`galactic_controller_conflicts_total{kind="address"}`); v > 0 {
			t.Logf("%s: %v address claims refused by the API server as held (its predecessor's claims)", c.Identity, v)
		}
	}
}

func TestAFullPoolSaysSoAndADeletionFreesAnAddressForAWaitingAttachment(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	ns := f.tenant(t, "small")
	f.createVPC(t, vpcObject(ns, "tiny", "10.40.0.0/28"))
	f.waitVPC(t, ns, "tiny", readyVPC)
	const n = 15 // a /28 has 13 addresses for attachments
	for i := range n {
		f.createAttachment(t, attachmentObject(ns, fmt.Sprintf("a%02d", i), "tiny"))
	}
	var ready, waiting []v1alpha1.VPCAttachment
	waitObject(t, waitLimit, "13 Ready and 2 PoolExhausted", func() (*v1alpha1.VPCAttachmentList, error) {
		return f.api.VPCAttachments(ns).List(ctx, metav1.ListOptions{})
	}, func(l *v1alpha1.VPCAttachmentList) error {
		ready, waiting = nil, nil
		for _, a := range l.Items {
			switch {
			case readyAttachment(&a) == nil:
				ready = append(ready, a)
			case notReady(v1alpha1.ReasonPoolExhausted)(&a) == nil:
				waiting = append(waiting, a)
			}
		}
		if len(ready) != 13 || len(waiting) != 2 {
			return fmt.Errorf("%d Ready, %d PoolExhausted", len(ready), len(waiting))
		}
		return nil
	})
	msg := readyMessage(&waiting[0])
	t.Logf("%s: %s", waiting[0].Name, msg)
	if !strings.Contains(msg, "10.40.0.0/28 has 13 usable") {
		t.Errorf("the PoolExhausted message should name the network and its size: %q", msg)
	}
	seen := map[string]bool{}
	for _, a := range ready {
		addr := string(a.Status.Addresses[0])
		if seen[addr] || addr == "10.40.0.0/28" || addr == "10.40.0.1/28" || addr == "10.40.0.15/28" {
			t.Errorf("%s got %s", a.Name, addr)
		}
		seen[addr] = true
	}

	freed := ready[4]
	if err := f.api.VPCAttachments(ns).Delete(ctx, freed.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitAttachment(t, ns, freed.Name, gone)
	var taker string
	waitObject(t, waitLimit, "a waiting attachment takes the freed address", func() (*v1alpha1.VPCAttachmentList, error) {
		return f.api.VPCAttachments(ns).List(ctx, metav1.ListOptions{})
	}, func(l *v1alpha1.VPCAttachmentList) error {
		for _, w := range waiting {
			for _, a := range l.Items {
				if a.Name == w.Name && readyAttachment(&a) == nil {
					if a.Status.Addresses[0] != freed.Status.Addresses[0] {
						return fmt.Errorf("%s got %s, not the freed %s", a.Name, a.Status.Addresses[0], freed.Status.Addresses[0])
					}
					taker = a.Name
					return nil
				}
			}
		}
		return errors.New("both still wait")
	})
	t.Logf("%s deleted; %s got its %s", freed.Name, taker, freed.Status.Addresses[0])
	for _, w := range waiting {
		if w.Name != taker {
			f.waitAttachment(t, ns, w.Name, notReady(v1alpha1.ReasonPoolExhausted))
		}
	}
}
