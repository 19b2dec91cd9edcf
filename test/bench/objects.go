package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
	"github.com/galactic-cni/galactic/test/harness"
)

// startController runs one galactic-controller for the section, as the
// admin and straight to the API server: its requests are the control
// plane's, not the plugins', so none of them passes through the counting
// proxy. It stops with the section.
func (b *bench) startController() error {
	bin := filepath.Join(b.env.BinDir, "galactic-controller")
	if _, err := os.Stat(bin); err != nil {
		if bin, err = harness.BuildController(b.dir); err != nil {
			return err
		}
	}
	c, err := harness.NewController(bin, b.env.CP.AdminKubeconfig, b.dir, fmt.Sprintf("bench-objects-%d", len(b.undo)))
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	b.undo = append(b.undo, c.Terminate)
	// Another section's controller may still hold the leader lease until
	// it expires.
	deadline := time.Now().Add(time.Minute)
	for {
		if v, ok, _ := c.Metric("galactic_controller_leader"); ok && v == 1 {
			return nil
		}
		if c.Exited() || time.Now().After(deadline) {
			return fmt.Errorf("galactic-controller does not lead:\n%s", c.LogTail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// benchTenant is a namespace with one VPC that galactic-controller made
// Ready.
type benchTenant struct {
	api     *client.Clients
	ns, vpc string
}

// tenant makes namespace ns (unless it exists) and VPC vpc over networks
// in it, and waits until the controller made it Ready. When the section
// ends its attachments and the VPC are deleted while the controller still
// runs (their finalizers need it).
func (b *bench) tenant(api *client.Clients, kube kubernetes.Interface, ns, vpc string, networks ...v1alpha1.CIDR) (*benchTenant, error) {
	ctx := b.ctx
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if _, err := api.VPCs(ns).Create(ctx, &v1alpha1.VPC{ObjectMeta: metav1.ObjectMeta{Name: vpc}, Spec: v1alpha1.VPCSpec{Networks: networks}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	t := &benchTenant{api: api, ns: ns, vpc: vpc}
	b.undo = append(b.undo, t.remove)
	err := harness.Poll(ctx, time.Minute, "VPC "+ns+"/"+vpc+" Ready", func() error {
		v, err := api.VPCs(ns).Get(ctx, vpc, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.ConditionReady) || v.Status.DataplaneName == "" {
			return fmt.Errorf("status %+v", v.Status)
		}
		return nil
	})
	return t, err
}

// attach makes VPCAttachment name of the tenant's VPC requesting addrs
// (none: one of each family) and waits until the controller made it Ready.
func (t *benchTenant) attach(ctx context.Context, name string, addrs ...string) (*v1alpha1.VPCAttachment, error) {
	spec := v1alpha1.VPCAttachmentSpec{VPC: t.vpc}
	for _, a := range addrs {
		spec.Addresses = append(spec.Addresses, v1alpha1.IPAddress(a))
	}
	if _, err := t.api.VPCAttachments(t.ns).Create(ctx, &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var a *v1alpha1.VPCAttachment
	err := harness.Poll(ctx, time.Minute, "VPCAttachment "+t.ns+"/"+name+" Ready", func() error {
		var err error
		if a, err = t.api.VPCAttachments(t.ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(a.Status.Conditions, v1alpha1.ConditionReady) || a.Status.Dataplane == nil || len(a.Status.Addresses) == 0 {
			return fmt.Errorf("status %+v", a.Status)
		}
		return nil
	})
	return a, err
}

// detach deletes attachment name; the controller lets it go once nothing
// uses it.
func (t *benchTenant) detach(ctx context.Context, name string) error {
	err := t.api.VPCAttachments(t.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// remove deletes the tenant's attachments and VPC and waits a little for
// the controller to let them go, so that they do not outlive the section
// that made them; what is left goes with the control plane.
func (t *benchTenant) remove() {
	ctx := context.Background()
	_ = t.api.VPCAttachments(t.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = t.api.VPCs(t.ns).Delete(ctx, t.vpc, metav1.DeleteOptions{})
	_ = harness.Poll(ctx, 15*time.Second, "VPC "+t.ns+"/"+t.vpc+" gone", func() error {
		_, err := t.api.VPCs(t.ns).Get(ctx, t.vpc, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

// The object-backed attachments' targets: ADD pays one GET of the
// VPCAttachment more than an inline ADD, DEL nothing; a pod naming a
// VPCAttachment starts through the cluster at most 1.10x as slow as one
// with the reference conflist.
const (
	targetObjectAddExtra = 3 * time.Millisecond
	targetObjectNoiseMin = time.Millisecond
	targetClusterRatio   = 1.10
	targetObjectCNIExtra = 1
)

// medianNoise is how far apart two p50s of samples like s fall by chance
// alone: twice the standard error of the difference of two medians of
// len(s) samples, the spread estimated from s's interquartile range (a
// median's standard error is about 1.25 σ/√n, σ about IQR/1.35), and at
// least targetObjectNoiseMin.
func medianNoise(s Sample) time.Duration {
	if len(s) == 0 {
		return targetObjectNoiseMin
	}
	iqr := float64(s.Quantile(0.75) - s.Quantile(0.25))
	se := 1.25 * (iqr / 1.35) / math.Sqrt(float64(len(s)))
	return max(targetObjectNoiseMin, time.Duration(2*math.Sqrt2*se))
}

func signedMS(d time.Duration) string {
	if d < 0 {
		return "−" + ms(-d)
	}
	return "+" + ms(d)
}

// objectTargets compare object-backed ADD and DEL with inline ones of the
// same run: latency in the chain section, requests in the API section.
func (r *Results) objectTargets() []Target {
	var ts []Target
	inline, obj := r.chain(ChainGalactic), r.chain(ChainObjects)
	if add := r.objectAddTarget(); add != nil {
		ts = append(ts, *add)
	}
	if inline != nil && obj != nil {
		d := obj.Del.P50() - inline.Del.P50()
		noise := medianNoise(inline.Del)
		t := Target{Key: "chain-objects/DEL", Section: "chain-latency",
			What:     "chain DEL p50 with a VPCAttachment unchanged from the inline attachment's within the noise (±twice the standard error of a difference of two p50s, from the inline DEL's interquartile range; at least " + ms(targetObjectNoiseMin) + ")",
			Measured: fmt.Sprintf("%s (%s)", signedMS(d), ms(obj.Del.P50())), Ref: fmt.Sprintf("inline DEL p50 %s, noise ±%s", ms(inline.Del.P50()), ms(noise)),
			Met: d <= noise && d >= -noise}
		if !t.Met {
			t.Miss = fmt.Sprintf("%s outside the noise", ms(max(d, -d)-noise))
		}
		ts = append(ts, t)
	}
	if len(r.Unattributed) > 0 {
		return ts
	}
	for _, v := range []struct {
		verb, inline, obj string
		cni               int
	}{{"ADD", "ADD", "ADD+object", targetObjectCNIExtra}, {"DEL", "DEL", "DEL+object", 0}} {
		in, ob := r.op(v.inline), r.op(v.obj)
		if in == nil || ob == nil {
			continue
		}
		cni, bgp := ob.Count(AgentCNI)-in.Count(AgentCNI), ob.Count(AgentBGP)-in.Count(AgentBGP)
		what := v.verb + " of a VPCAttachment on the common path: galactic-cni no more API requests than inline (it works from the node record), galactic-bgp none more"
		if v.cni > 0 {
			what = fmt.Sprintf("%s of a VPCAttachment on the common path: galactic-cni at most %d API request more than inline (the GET of the attachment), galactic-bgp none more", v.verb, v.cni)
		}
		t := Target{Key: "api-objects/" + v.verb, Section: "api-requests", What: what,
			Measured: fmt.Sprintf("galactic-cni %+d, galactic-bgp %+d", cni, bgp),
			Ref:      fmt.Sprintf("inline: galactic-cni %d, galactic-bgp %d", in.Count(AgentCNI), in.Count(AgentBGP)), Met: cni <= v.cni && bgp <= 0}
		if !t.Met {
			var over []string
			if cni > v.cni {
				over = append(over, fmt.Sprintf("galactic-cni %d over", cni-v.cni))
			}
			if bgp > 0 {
				over = append(over, fmt.Sprintf("galactic-bgp %d over", bgp))
			}
			t.Miss = strings.Join(over, ", ")
		}
		ts = append(ts, t)
	}
	return ts
}

// objectAddTarget judges the GET an object-backed ADD adds. It compares
// the handoff-on chains, whose galactic-cni both make an API client for
// the lease, so that the difference is the GET; the handoff-off pair,
// where the object-backed galactic-cni also makes the client the inline
// one never needs, is reported beside it. Without the handoff-on pair the
// handoff-off one is judged.
func (r *Results) objectAddTarget() *Target {
	in, ob := r.chain(ChainHandoff), r.chain(ChainObjectsHandoff)
	inOff, obOff := r.chain(ChainGalactic), r.chain(ChainObjects)
	label := "both with handoff on, so both make galactic-cni's API client"
	if in == nil || ob == nil {
		in, ob, inOff, obOff = inOff, obOff, nil, nil
		label = "handoff off"
	}
	if in == nil || ob == nil {
		return nil
	}
	d := ob.Add.P50() - in.Add.P50()
	t := Target{Key: "chain-objects/ADD", Section: "chain-latency",
		What:     fmt.Sprintf("chain ADD p50 with a VPCAttachment at most %s over the inline attachment's (one GET; %s)", ms(targetObjectAddExtra), label),
		Measured: fmt.Sprintf("%s (%s)", signedMS(d), ms(ob.Add.P50())), Ref: fmt.Sprintf("inline ADD p50 %s", ms(in.Add.P50())), Met: d <= targetObjectAddExtra}
	if inOff != nil && obOff != nil {
		t.Ref += fmt.Sprintf("; with handoff off, where the GET is galactic-cni's only request and pays for its client and connection, %s (%s against %s)",
			signedMS(obOff.Add.P50()-inOff.Add.P50()), ms(obOff.Add.P50()), ms(inOff.Add.P50()))
	}
	if !t.Met {
		t.Miss = fmt.Sprintf("%s over", ms(d-targetObjectAddExtra))
	}
	return &t
}

// clusterTargets judge pod start through the cluster, a pod naming a
// VPCAttachment against one with the reference conflist.
func (r *Results) clusterTargets() []Target {
	cb := r.Cluster
	if cb == nil || cb.Skipped != "" {
		return nil
	}
	var ref, gal *ClusterResult
	for _, row := range cb.Rows {
		switch {
		case row.Name == ClusterReference && len(row.Ready) > 0:
			ref = row
		case row.Name == ClusterGalactic && len(row.Ready) > 0:
			gal = row
		}
	}
	if ref == nil || gal == nil {
		return nil
	}
	q := Ratio(gal.Ready.P50(), ref.Ready.P50())
	t := Target{Key: "cluster-ratio", Section: "cluster-pod-start",
		What:     fmt.Sprintf("pod create → Ready p50 through the cluster with a VPCAttachment at most %.2fx the reference conflist's", targetClusterRatio),
		Measured: fmt.Sprintf("%s (%s)", ratio(q), ms(gal.Ready.P50())), Ref: fmt.Sprintf("reference p50 %s", ms(ref.Ready.P50())), Met: q <= targetClusterRatio}
	if !t.Met {
		t.Miss = fmt.Sprintf("%s over (%.0f%%)", ms(gal.Ready.P50()-time.Duration(targetClusterRatio*float64(ref.Ready.P50()))), 100*(q/targetClusterRatio-1))
	}
	return []Target{t}
}

// objectReason says why an object-backed target was missed.
func (r *Results) objectReason(t Target) string {
	switch t.Key {
	case "chain-objects/ADD", "chain-objects/DEL":
		why := "The object-backed chain differs from the inline one by galactic-cni's GET of the VPCAttachment on ADD and the fields it writes into the node record for galactic-bgp"
		verb := strings.TrimPrefix(t.Key, "chain-objects/")
		if o := r.op(verb + "+object"); o != nil {
			why += fmt.Sprintf("; its %s asked, of galactic-cni: %s; of galactic-bgp: %s (%s)", verb, o.Describe(AgentCNI), o.Describe(AgentBGP), r.secLink("api-requests"))
		}
		if t.Key == "chain-objects/ADD" && r.chain(ChainObjectsHandoff) == nil {
			why += ". With handoff off galactic-cni makes no API request for an inline attachment, so the GET is its first: the object-backed ADD also pays for galactic-cni's API client, its TLS handshake and the round trip"
		}
		return why + "."
	case "cluster-ratio":
		cb := r.Cluster
		var ping string
		for _, row := range cb.Rows {
			if row.Name == ClusterGalactic && len(row.FirstPing) > 0 {
				ping = fmt.Sprintf("; its first ping across nodes came at %s p50", ms(row.FirstPing.P50()))
			}
		}
		return fmt.Sprintf("Both pods go through the same API server, scheduler, kubelet and containerd; the difference is the CNI ADD, galactic's chain (a GET of the VPCAttachment, the lease with handoff on, the advertisement) against `tap` + `static`%s (%s).", ping, r.secLink("cluster-pod-start"))
	}
	return fmt.Sprintf("The requests each program made are listed in %s: the object-backed row against the inline one of the same verb.", r.secLink("api-requests"))
}
