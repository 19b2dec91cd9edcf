package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/galactic-cni/galactic/pkg/client"
)

// ControllerServiceAccount is galactic-controller's identity
// (installer/manifests/controller-rbac.yaml).
const ControllerServiceAccount = "galactic-controller"

// controllerManifests are what a cluster needs for the controller to run
// under its own identity and for tenants to use VPCs: the node identity
// (whose ClusterRole reads attachments), the tenants' roles, the
// controller's, and the policy that protects attachments from creation.
var controllerManifests = []string{"serviceaccount.yaml", "rbac.yaml", "runtime-rbac.yaml", "tenant-rbac.yaml", "controller-rbac.yaml", "attachment-admission.yaml"}

// ApplyControllerManifests creates galactic's namespace, applies what of
// installer/manifests the controller and tenants rely on, and returns once
// the API server applies the attachment policy.
func ApplyControllerManifests(ctx context.Context, cp *ControlPlane) error {
	kube, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return err
	}
	_, err = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	var paths []string
	for _, m := range controllerManifests {
		paths = append(paths, filepath.Join(RepoRoot(), "installer", "manifests", m))
	}
	if err := ApplyManifests(ctx, cp.Admin, paths...); err != nil {
		return err
	}
	api, err := client.New(cp.Admin)
	if err != nil {
		return err
	}
	return waitAttachmentPolicy(ctx, api)
}

// ServiceAccountKubeconfig writes a kubeconfig at path for the service
// account namespace/name, with a token from the TokenRequest API.
func ServiceAccountKubeconfig(ctx context.Context, cp *ControlPlane, namespace, name, path string) error {
	kube, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return err
	}
	seconds := int64(tokenSeconds)
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token request for %s/%s: %w", namespace, name, err)
	}
	return WriteKubeconfig(path, cp.Server, cp.CAFile, &clientcmdapi.AuthInfo{Token: tr.Status.Token})
}

// BuildController builds galactic-controller into dir and returns its path.
func BuildController(dir string) (string, error) {
	out := filepath.Join(dir, "galactic-controller")
	cmd := exec.Command("go", "build", "-o", out, "./controller/cmd/galactic-controller")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building galactic-controller: %v\n%s", err, b)
	}
	return out, nil
}

// Controller is one galactic-controller process; Start starts it again
// after Kill or Terminate, as a Deployment would.
type Controller struct {
	// Identity is its leader lease holder identity.
	Identity string
	// Bin, Kubeconfig and Args are what it runs with.
	Bin, Kubeconfig string
	Args            []string
	// Env is added to this process's environment (GOGC=..., say).
	Env []string
	// MetricsAddress serves /metrics, /healthz and /readyz.
	MetricsAddress string
	LogPath        string

	Daemon
}

// NewController describes a controller logging into dir; args follow
// --kubeconfig, --identity and --metrics-address.
func NewController(bin, kubeconfig, dir, identity string, args ...string) (*Controller, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	return &Controller{Identity: identity, Bin: bin, Kubeconfig: kubeconfig, Args: args,
		MetricsAddress: "127.0.0.1:" + strconv.Itoa(ports[0]), LogPath: filepath.Join(dir, identity+".log")}, nil
}

// Start starts the process.
func (c *Controller) Start() error {
	cmd := exec.Command(c.Bin, append([]string{"--kubeconfig", c.Kubeconfig, "--identity", c.Identity,
		"--metrics-address", c.MetricsAddress}, c.Args...)...)
	if len(c.Env) > 0 {
		cmd.Env = append(os.Environ(), c.Env...)
	}
	_, err := c.start("galactic-controller "+c.Identity, cmd, c.LogPath)
	return err
}

// Exited reports whether a started process has ended on its own.
func (c *Controller) Exited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc != nil && !c.proc.Running()
}

// LogTail is the end of its log, for failure messages.
func (c *Controller) LogTail(lines int) string { return fileTail(c.LogPath, lines) }

// get fetches one of its endpoints.
func (c *Controller) get(path string) (int, string, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + c.MetricsAddress + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Ready reports whether /readyz answers 200.
func (c *Controller) Ready() bool {
	code, _, err := c.get("/readyz")
	return err == nil && code == http.StatusOK
}

// Metric returns the value of the sample whose name and labels, as
// written in the exposition (`galactic_controller_leader` or
// `galactic_controller_allocations_total{kind="address"}`), are series;
// ok is false when it is absent.
func (c *Controller) Metric(series string) (v float64, ok bool, err error) {
	code, body, err := c.get("/metrics")
	if err != nil {
		return 0, false, err
	}
	if code != http.StatusOK {
		return 0, false, fmt.Errorf("/metrics: %d", code)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		name, value, found := strings.Cut(sc.Text(), " ")
		if found && name == series {
			v, err := strconv.ParseFloat(value, 64)
			return v, err == nil, err
		}
	}
	return 0, false, nil
}
