package scale

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestTheReflectorSetAppliesAndItsConfigIsAReflectorThatTakesTheHostAddress(t *testing.T) {
	env := harness.Setup(t)
	base := filepath.Join(harness.RepoRoot(), "installer", "manifests")
	dir := filepath.Join(base, "reflector")
	var k struct {
		Kind      string   `json:"kind"`
		Resources []string `json:"resources"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := utilyaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	if k.Kind != "Component" || !slices.Equal(k.Resources, []string{"config.yaml", "daemonset.yaml"}) {
		t.Fatalf("kustomization %+v", k)
	}
	paths := []string{filepath.Join(base, "namespace.yaml")}
	for _, r := range k.Resources {
		paths = append(paths, filepath.Join(dir, r))
	}
	if err := harness.ApplyManifests(context.Background(), env.CP.Admin, paths...); err != nil {
		t.Fatalf("applying the reflector set: %v", err)
	}
	ds, err := env.Kube.AppsV1().DaemonSets(harness.Namespace).Get(context.Background(), "galactic-reflector", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkReflectorPod(t, ds)
	cm, err := env.Kube.CoreV1().ConfigMaps(harness.Namespace).Get(context.Background(), "galactic-reflector", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "router.json")
	if err := os.WriteFile(file, []byte(cm.Data["router.json"]), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.LoadWithUnderlay(file, "192.0.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if c.Role != config.RoleReflector || c.RouterID.String() != "192.0.2.3" || len(c.ClientRanges) == 0 || c.ListenPort != 179 {
		t.Fatalf("the shipped reflector config: %+v", c)
	}
}

func checkReflectorPod(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.NodeSelector["network.galactic.dev/reflector"] != "true" {
		t.Errorf("host network %v, node selector %v", spec.HostNetwork, spec.NodeSelector)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || len(spec.Volumes) != 1 {
		t.Errorf("a reflector needs no token and no host path: automount %v, volumes %+v", spec.AutomountServiceAccountToken, spec.Volumes)
	}
	c := spec.Containers[0]
	if !slices.Contains(c.Args, "--underlay=$(HOST_IP)") || c.ReadinessProbe == nil {
		t.Errorf("container %+v", c)
	}
	if caps := c.SecurityContext.Capabilities; len(caps.Add) != 1 || caps.Add[0] != "NET_BIND_SERVICE" {
		t.Errorf("capabilities %+v, want NET_BIND_SERVICE only", caps)
	}
}
