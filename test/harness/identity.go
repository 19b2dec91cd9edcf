package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/client"
)

// ServiceAccount is the identity every node's galactic components share
// (installer/manifests/serviceaccount.yaml).
const ServiceAccount = "galactic-node"

// AdmissionPolicy is the per-node policy of
// installer/manifests/admission.yaml; its refusals name it.
const AdmissionPolicy = "galactic-node-writes-its-own"

// tokenSeconds outlives any one test binary or demo; nothing refreshes a
// harness node's kubeconfig.
const tokenSeconds = 12 * 3600

// identityManifests are what every environment applies from
// installer/manifests, so every node credential is judged, and every
// VPCAttachment admitted, as on a cluster.
var identityManifests = []string{"serviceaccount.yaml", "rbac.yaml", "runtime-rbac.yaml", "admission.yaml", "attachment-admission.yaml"}

func (e *Env) applyIdentity(ctx context.Context) error {
	var paths []string
	for _, m := range identityManifests {
		paths = append(paths, filepath.Join(RepoRoot(), "installer", "manifests", m))
	}
	if err := ApplyManifests(ctx, e.CP.Admin, paths...); err != nil {
		return err
	}
	if err := e.waitAdmissionPolicy(ctx); err != nil {
		return err
	}
	return waitAttachmentPolicy(ctx, e.API)
}

// waitAttachmentPolicy returns once the API server puts the protection
// finalizer on a new VPCAttachment (attachment-admission.yaml), which,
// like the per-node policy, it starts doing some time after the objects
// exist. The probe is a dry run: it is admitted and never stored.
func waitAttachmentPolicy(ctx context.Context, api *client.Clients) error {
	probe := &v1alpha1.VPCAttachment{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "galactic-admission-probe"}, Spec: v1alpha1.VPCAttachmentSpec{VPC: "probe"}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Until the CRD is served, the probe is refused as an unknown kind.
		out, err := api.VPCAttachments(Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil && slices.Contains(out.Finalizers, v1alpha1.FinalizerAttachment) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API server did not apply installer/manifests/attachment-admission.yaml within 30s (last probe: %v)", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitAdmissionPolicy returns once the API server enforces the per-node
// policy, which it loads some time after the objects exist: until then a
// lease write with a token bound to no node succeeds.
func (e *Env) waitAdmissionPolicy(ctx context.Context) error {
	token, err := e.UnboundToken(ctx)
	if err != nil {
		return err
	}
	leases, err := kubernetes.NewForConfig(e.TokenConfig(token))
	if err != nil {
		return err
	}
	const probe = "galactic-admission-probe"
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := leases.CoordinationV1().Leases(Namespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: probe}}, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			_ = e.Kube.CoordinationV1().Leases(Namespace).Delete(ctx, probe, metav1.DeleteOptions{})
		} else if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "authentication.kubernetes.io/node-name") {
			return nil
		} else if !apierrors.IsForbidden(err) {
			return fmt.Errorf("probing the admission policy: %w", err)
		}
		if time.Now().After(deadline) {
			return errors.New("the API server did not enforce installer/manifests/admission.yaml within 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// NodeToken returns a galactic-node token bound to a Pod on Node node, as
// the kubelet projects one into the DaemonSet's pod there: the API server
// puts the node in it. It creates the Node and the Pod when they are
// missing; the token stays valid while the Pod exists.
func (e *Env) NodeToken(ctx context.Context, node string) (string, error) {
	_, err := e.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("node %s: %w", node, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(node), Namespace: Namespace},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           ServiceAccount,
			AutomountServiceAccountToken: new(false),
			Containers:                   []corev1.Container{{Name: "galactic", Image: "galactic.invalid/galactic:harness"}},
		},
	}
	if _, err := e.Kube.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("pod for node %s: %w", node, err)
	}
	return e.Token(ctx, ServiceAccount, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name})
}

// NodeBoundToken returns a galactic-node token bound to the Node object
// node, the credential galactic-installer keeps in a node's kubeconfig: it
// carries the node claim and stays valid while the Node exists, whatever
// happens to the pods on it. It creates the Node when it is missing.
func (e *Env) NodeBoundToken(ctx context.Context, node string) (string, error) {
	_, err := e.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("node %s: %w", node, err)
	}
	return e.Token(ctx, ServiceAccount, NodeRef(node))
}

// NodeRef is a TokenRequest's reference to the Node object node.
func NodeRef(node string) *authenticationv1.BoundObjectReference {
	return &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node}
}

// UnboundToken returns a galactic-node token bound to no pod, so it carries
// no node: what a hand-made kubeconfig would hold.
func (e *Env) UnboundToken(ctx context.Context) (string, error) {
	return e.Token(ctx, ServiceAccount, nil)
}

// Token requests a token of the service account called account in
// Namespace through the TokenRequest API, bound to bound when it is not nil.
func (e *Env) Token(ctx context.Context, account string, bound *authenticationv1.BoundObjectReference) (string, error) {
	seconds := int64(tokenSeconds)
	tr, err := e.Kube.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, account,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds, BoundObjectRef: bound}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token request for %s: %w", account, err)
	}
	return tr.Status.Token, nil
}

// TokenConfig is a client config for the API server authenticating with
// token.
func (e *Env) TokenConfig(token string) *rest.Config {
	return &rest.Config{Host: e.CP.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: e.CP.CAFile}, QPS: -1}
}

// writeNodeKubeconfig gives node's components their own credential, bound
// to the Node as galactic-installer's is.
func (e *Env) writeNodeKubeconfig(ctx context.Context, path, node string) error {
	token, err := e.NodeBoundToken(ctx, node)
	if err != nil {
		return err
	}
	return WriteKubeconfig(path, e.CP.Server, e.CP.CAFile, &clientcmdapi.AuthInfo{Token: token})
}

// podName is a DNS label, as a pod's hostname should be.
func podName(node string) string {
	name := ServiceAccount + "-" + node
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	h := sha256.Sum256([]byte(node))
	return ServiceAccount + "-" + hex.EncodeToString(h[:8])
}

// VPCNodeLabel marks a node dedicated to VPC workloads; the DaemonSet runs
// only there (installer/manifests/daemonset.yaml).
const VPCNodeLabel = "network.galactic.dev/vpc-workloads"

// VPCNodeTaint keeps pods that are not VPC workloads off a dedicated node.
func VPCNodeTaint() corev1.Taint {
	return corev1.Taint{Key: VPCNodeLabel, Value: "true", Effect: corev1.TaintEffectNoSchedule}
}
