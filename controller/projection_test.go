package controller

import (
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/handoff"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// lease is a handoff lease as pkg/handoff writes it.
func lease(holder string, token int32, report handoff.Report) *coordinationv1.Lease {
	l := handoff.LeaseFromRecord("galactic-system", "blue-1.web-2", "7", handoff.Record{
		HolderIdentity: holder, LeaseDurationSeconds: 60, LeaseTransitions: token, Report: report, RenewTime: t0, AcquireTime: t0,
	})
	return l
}

func advert(node string, programmed *metav1.Condition, entries ...v1alpha1.ContainerEntry) *v1alpha1.BGPAdvertisement {
	a := &v1alpha1.BGPAdvertisement{ObjectMeta: metav1.ObjectMeta{Name: "blue-1.web-2." + node}, Spec: v1alpha1.BGPAdvertisementSpec{Node: node, Containers: entries}}
	if programmed != nil {
		a.Status.Conditions = []metav1.Condition{*programmed}
	}
	return a
}

func cond(status metav1.ConditionStatus, reason string) *metav1.Condition {
	return &metav1.Condition{Type: v1alpha1.ConditionProgrammed, Status: status, Reason: reason, Message: "from the router"}
}

func summary(st holderState) string {
	h := "none"
	if st.Holder != nil {
		h = fmt.Sprintf("%s@%d", st.Holder.Node, st.Holder.Generation)
	}
	return fmt.Sprintf("holder=%s programmed=%s/%s available=%s/%s inUse=%v", h,
		st.Programmed.Status, st.Programmed.Reason, st.HolderAvailable.Status, st.HolderAvailable.Reason, st.InUse)
}

func TestProjectHolder(t *testing.T) {
	live := v1alpha1.ContainerEntry{ContainerID: "c1", IfName: "eth0", HolderGeneration: 3}
	standby := v1alpha1.ContainerEntry{ContainerID: "c2", IfName: "eth0", Standby: true}
	acquired := handoff.Report{Set: true, Token: 3, Reason: handoff.ReasonAcquired}
	available := handoff.Report{Set: true, Available: true, Token: 3}
	for _, tc := range []struct {
		name string
		in   holderInputs
		want string
	}{
		{"nothing yet", holderInputs{Now: t0},
			"holder=none programmed=False/NotAttached available=False/NoHolder inUse=false"},
		{"acquired: holder shown, not available until it reports",
			holderInputs{Lease: lease("node-a/c1", 3, acquired), LeaseSeen: t0, Now: t0.Add(time.Second)},
			"holder=node-a@3 programmed=Unknown/Pending available=False/Acquired inUse=true"},
		{"available under the current token, advertised and programmed",
			holderInputs{Lease: lease("node-a/c1", 3, available), LeaseSeen: t0, Now: t0.Add(time.Second),
				Adverts: []*v1alpha1.BGPAdvertisement{advert("node-a", cond(metav1.ConditionTrue, "Announced"), live)}},
			"holder=node-a@3 programmed=True/Announced available=True/Available inUse=true"},
		{"a predecessor's report (older token) is never shown",
			holderInputs{Lease: lease("node-b/c9", 4, handoff.Report{Set: true, Available: true, Token: 3}), LeaseSeen: t0, Now: t0.Add(time.Second)},
			"holder=node-b@4 programmed=Unknown/Pending available=False/NoReport inUse=true"},
		{"Programmed comes from the holder's node, not another",
			holderInputs{Lease: lease("node-b/c9", 4, available), LeaseSeen: t0, Now: t0,
				Adverts: []*v1alpha1.BGPAdvertisement{advert("node-a", cond(metav1.ConditionTrue, "Announced"), live), advert("node-b", cond(metav1.ConditionFalse, "NoEstablishedPeer"), live)}},
			"holder=node-b@4 programmed=False/NoEstablishedPeer available=False/NoReport inUse=true"},
		{"an advertisement without the condition yet",
			holderInputs{Lease: lease("node-a/c1", 3, available), LeaseSeen: t0, Now: t0, Adverts: []*v1alpha1.BGPAdvertisement{advert("node-a", nil, live)}},
			"holder=node-a@3 programmed=Unknown/Pending available=True/Available inUse=true"},
		{"released: no holder, the one serving advertisement still counts",
			holderInputs{Lease: lease("", 3, handoff.Report{Set: true, Token: 3, Reason: handoff.ReasonReleased}), LeaseSeen: t0, Now: t0,
				Adverts: []*v1alpha1.BGPAdvertisement{advert("node-a", cond(metav1.ConditionTrue, "Announced"), live), advert("node-b", nil, standby)}},
			"holder=none programmed=True/Announced available=False/NoHolder inUse=true"},
		{"expired by this controller's observation: no holder, not in use",
			holderInputs{Lease: lease("node-a/c1", 3, available), LeaseSeen: t0, Now: t0.Add(61 * time.Second)},
			"holder=none programmed=False/NotAttached available=False/NoHolder inUse=false"},
		{"two nodes advertise and none holds",
			holderInputs{Now: t0, Adverts: []*v1alpha1.BGPAdvertisement{advert("node-a", nil, live), advert("node-b", nil, live)}},
			"holder=none programmed=Unknown/Pending available=False/NoHolder inUse=true"},
		{"being deleted while held: terminating, in use",
			holderInputs{Deleting: true, Lease: lease("node-a/c1", 3, available), LeaseSeen: t0, Now: t0},
			"holder=node-a@3 programmed=Unknown/Pending available=False/HolderTerminating inUse=true"},
		{"being deleted and free",
			holderInputs{Deleting: true, Now: t0},
			"holder=none programmed=False/NotAttached available=False/HolderTerminating inUse=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summary(projectHolder(tc.in)); got != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestTheHolderExpiresByThisControllersObservation(t *testing.T) {
	st := projectHolder(holderInputs{Lease: lease("node-a/c1", 3, handoff.Report{}), LeaseSeen: t0, Now: t0.Add(20 * time.Second)})
	if st.ExpiresIn != 40*time.Second {
		t.Errorf("ExpiresIn = %s, want 40s (60 s from when it was seen)", st.ExpiresIn)
	}
}
