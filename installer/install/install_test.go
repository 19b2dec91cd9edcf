package install

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/test/harness"
)

// fixture is a temporary root plus the inputs of an install: plugin
// binaries, a service account token and CA, and the in-cluster environment.
type fixture struct {
	root, src, token, ca string
	env                  map[string]string
	out                  bytes.Buffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{
		root:  filepath.Join(dir, "root"),
		src:   filepath.Join(dir, "src"),
		token: filepath.Join(dir, "sa", "token"),
		ca:    filepath.Join(dir, "sa", "ca.crt"),
		env:   map[string]string{EnvNodeName: "node-a", EnvServiceHost: "10.96.0.1", EnvServicePort: "443"},
	}
	for _, d := range []string{f.root, f.src, filepath.Dir(f.token)} {
		must(t, os.MkdirAll(d, 0o755))
	}
	for _, b := range Binaries() {
		must(t, os.WriteFile(filepath.Join(f.src, b), []byte("#!/bin/sh\necho "+b+"\n"), 0o700))
	}
	must(t, os.WriteFile(f.token, []byte(token1+"\n"), 0o600))
	must(t, os.WriteFile(f.ca, []byte("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"), 0o644))
	return f
}

// token1 is the fixture's service account token.
var token1 = podToken("node-a", 1)

func (f *fixture) options() Options {
	return Options{
		Root: f.root, SourceDir: f.src, TokenFile: f.token, CAFile: f.ca,
		Getenv: func(k string) string { return f.env[k] },
		Out:    &f.out,
	}
}

func (f *fixture) path(p string) string { return filepath.Join(f.root, p) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestInstallWritesThePluginsNodeSettingsAndKubeconfigWithTheirModes(t *testing.T) {
	f := newFixture(t)
	o := f.options()
	o.RequireAttachmentObjects = true
	must(t, Install(o))

	for _, c := range []struct {
		path string
		mode fs.FileMode
	}{
		{"/opt/cni/bin/galactic-cni", 0o755},
		{"/opt/cni/bin/galactic-bgp", 0o755},
		{"/etc/galactic/node.json", 0o644},
		{"/etc/galactic/kubeconfig", 0o600},
		{"/etc/galactic/token", 0o600},
		{"/var/lib/galactic", fs.ModeDir | 0o700},
		{"/var/log/galactic", fs.ModeDir | 0o755},
	} {
		st, err := os.Stat(f.path(c.path))
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if st.Mode() != c.mode {
			t.Errorf("%s: mode %s, want %s", c.path, st.Mode(), c.mode)
		}
	}
	got, _ := os.ReadFile(f.path("/opt/cni/bin/galactic-cni"))
	want, _ := os.ReadFile(filepath.Join(f.src, "galactic-cni"))
	if !bytes.Equal(got, want) {
		t.Error("galactic-cni was not copied verbatim")
	}

	// The plugins read the settings through pkg/settings; every path they
	// name is inside the root, where install put the files.
	n, err := settings.Load(func(k string) string {
		if k == settings.EnvConfig {
			return f.path("/etc/galactic/node.json")
		}
		return ""
	})
	must(t, err)
	wantNode := settings.Node{
		NodeName: "node-a", Kubeconfig: f.path("/etc/galactic/kubeconfig"), Namespace: "galactic-system",
		StateDir: f.path("/var/lib/galactic"), LogFile: f.path("/var/log/galactic/galactic.log"), Path: f.path("/etc/galactic/node.json"),
		RequireAttachmentObjects: true,
	}
	if n != wantNode {
		t.Errorf("node settings:\n got %+v\nwant %+v", n, wantNode)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", f.path("/etc/galactic/kubeconfig"))
	must(t, err)
	if cfg.Host != "https://10.96.0.1:443" || cfg.BearerToken != token1 || cfg.BearerTokenFile != f.path("/etc/galactic/token") || !bytes.Contains(cfg.CAData, []byte("fake")) {
		t.Errorf("kubeconfig: host %q token %q tokenFile %q CA %q", cfg.Host, cfg.BearerToken, cfg.BearerTokenFile, cfg.CAData)
	}
	if tok, _ := os.ReadFile(f.path("/etc/galactic/token")); string(tok) != token1 {
		t.Errorf("token copy %q, want the service account token without its newline", tok)
	}
}

func TestASecondInstallWithTheSameInputsChangesNothingAndSaysSo(t *testing.T) {
	f := newFixture(t)
	must(t, Install(f.options()))
	before := harness.Tree(t, f.root, true)
	f.out.Reset()

	must(t, Install(f.options()))
	if after := harness.Tree(t, f.root, true); after != before {
		t.Errorf("the second install rewrote files:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	lines := strings.Split(strings.TrimSpace(f.out.String()), "\n")
	for _, l := range lines[:len(lines)-1] {
		if !strings.HasPrefix(l, "unchanged: ") && !strings.HasPrefix(l, "router: ") {
			t.Errorf("second install printed %q, want only unchanged: lines", l)
		}
	}
	if len(lines) != 7 || !strings.Contains(lines[len(lines)-1], "nothing changed") {
		t.Errorf("second install output:\n%s", f.out.String())
	}
}

func TestInstallReplacesAChangedFileAndKeepsTheRecordComplete(t *testing.T) {
	f := newFixture(t)
	must(t, Install(f.options()))
	must(t, os.WriteFile(filepath.Join(f.src, "galactic-bgp"), []byte("new build"), 0o755))
	must(t, os.Chmod(f.path("/etc/galactic/node.json"), 0o600))
	f.out.Reset()

	must(t, Install(f.options()))
	for _, want := range []string{
		"update: " + f.path("/opt/cni/bin/galactic-bgp"),
		"update: " + f.path("/etc/galactic/node.json"),
		"unchanged: " + f.path("/opt/cni/bin/galactic-cni"),
	} {
		if !strings.Contains(f.out.String(), want+"\n") {
			t.Errorf("output lacks %q:\n%s", want, f.out.String())
		}
	}
	if got, _ := os.ReadFile(f.path("/opt/cni/bin/galactic-bgp")); string(got) != "new build" {
		t.Errorf("galactic-bgp not replaced: %q", got)
	}
	r, _, err := readRecord(f.path("/var/lib/galactic/installed.json"))
	must(t, err)
	if len(r.Files) != 5 || len(r.Directories) != 10 {
		t.Errorf("record after an update: %+v", r)
	}
}

func TestUninstallLeavesTheRootAsItWasBeforeInstall(t *testing.T) {
	f := newFixture(t)
	// A node that already has a CNI bin dir with another plugin in it.
	must(t, os.MkdirAll(f.path("/opt/cni/bin"), 0o755))
	must(t, os.WriteFile(f.path("/opt/cni/bin/loopback"), []byte("loopback"), 0o755))
	before := harness.Tree(t, f.root, false)

	must(t, Install(f.options()))
	must(t, Install(f.options()))
	must(t, Uninstall(f.options()))
	if after := harness.Tree(t, f.root, false); after != before {
		t.Errorf("uninstall did not restore the root:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	f.out.Reset()
	must(t, Uninstall(f.options()))
	if !strings.Contains(f.out.String(), "nothing to uninstall") {
		t.Errorf("a second uninstall should say there is nothing to do: %s", f.out.String())
	}
}

func TestUninstallRemovesGalacticsEmptyDirectoriesThatTheKubeletMade(t *testing.T) {
	f := newFixture(t)
	for _, d := range []string{"/etc", "/var/lib", "/var/log"} {
		must(t, os.MkdirAll(f.path(d), 0o755))
	}
	before := harness.Tree(t, f.root, false)
	// The DaemonSet's hostPaths (DirectoryOrCreate) exist before install.
	for _, d := range []string{"/etc/galactic", "/var/lib/galactic", "/var/log/galactic"} {
		must(t, os.MkdirAll(f.path(d), 0o755))
	}
	must(t, Install(f.options()))
	must(t, os.WriteFile(f.path("/var/log/galactic/galactic.log"), []byte("{}\n"), 0o644))
	must(t, Uninstall(f.options()))
	for _, d := range []string{"/etc/galactic", "/var/lib/galactic"} {
		if _, err := os.Stat(f.path(d)); err == nil {
			t.Errorf("%s should be gone", d)
		}
	}
	if _, err := os.Stat(f.path("/var/log/galactic/galactic.log")); err != nil {
		t.Errorf("the log should survive uninstall: %v", err)
	}
	must(t, os.RemoveAll(f.path("/var/log/galactic")))
	if after := harness.Tree(t, f.root, false); after != before {
		t.Errorf("uninstall left:\n%s", after)
	}
}

func TestUninstallWorksUnderAnotherRootThanInstall(t *testing.T) {
	// Installed on the node itself, uninstalled from a pod that mounts the
	// host's filesystem elsewhere: the record holds host paths.
	f := newFixture(t)
	before := harness.Tree(t, f.root, false)
	must(t, Install(f.options()))
	r, _, err := readRecord(f.path("/var/lib/galactic/installed.json"))
	must(t, err)
	if !slices.Contains(r.Files, "/opt/cni/bin/galactic-cni") {
		t.Errorf("the record should hold host paths: %v", r.Files)
	}
	moved := filepath.Join(t.TempDir(), "host")
	must(t, os.Rename(f.root, moved))
	o := f.options()
	o.Root = moved
	must(t, Uninstall(o))
	if after := harness.Tree(t, moved, false); after != before {
		t.Errorf("uninstall under the new root left:\n%s", after)
	}
}

func TestUninstallKeepsWhatOthersWroteAndFilesThatWereAlreadyInPlace(t *testing.T) {
	f := newFixture(t)
	// galactic-bgp is already there with the same content: install does
	// not write it, so it is not install's to remove.
	must(t, os.MkdirAll(f.path("/opt/cni/bin"), 0o755))
	bgp, _ := os.ReadFile(filepath.Join(f.src, "galactic-bgp"))
	must(t, os.WriteFile(f.path("/opt/cni/bin/galactic-bgp"), bgp, 0o755))
	must(t, Install(f.options()))
	// The plugins' own state and log.
	must(t, os.WriteFile(f.path("/var/lib/galactic/node.lock"), nil, 0o600))
	must(t, os.WriteFile(f.path("/var/log/galactic/galactic.log"), []byte("{}\n"), 0o644))
	f.out.Reset()

	must(t, Uninstall(f.options()))
	for _, p := range []string{"/opt/cni/bin/galactic-bgp", "/var/lib/galactic/node.lock", "/var/log/galactic/galactic.log"} {
		if _, err := os.Stat(f.path(p)); err != nil {
			t.Errorf("%s should survive uninstall: %v", p, err)
		}
	}
	for _, p := range []string{"/opt/cni/bin/galactic-cni", "/etc/galactic", "/var/lib/galactic/installed.json"} {
		if _, err := os.Stat(f.path(p)); err == nil {
			t.Errorf("%s should be gone", p)
		}
	}
	if !strings.Contains(f.out.String(), "kept directory: "+f.path("/var/lib/galactic")) {
		t.Errorf("uninstall should say which directories it kept:\n%s", f.out.String())
	}
}

func TestDryRunPrintsThePlanAndWritesNothing(t *testing.T) {
	f := newFixture(t)
	before := harness.Tree(t, f.root, true)
	o := f.options()
	o.DryRun = true
	must(t, Install(o))
	if after := harness.Tree(t, f.root, true); after != before {
		t.Errorf("dry run wrote:\n%s", after)
	}
	for _, want := range []string{"would create directory: " + f.path("/opt/cni/bin"), "would install: " + f.path("/etc/galactic/kubeconfig"), "dry run: nothing written"} {
		if !strings.Contains(f.out.String(), want) {
			t.Errorf("dry-run output lacks %q:\n%s", want, f.out.String())
		}
	}

	must(t, Install(f.options()))
	before = harness.Tree(t, f.root, true)
	must(t, Uninstall(o))
	if after := harness.Tree(t, f.root, true); after != before {
		t.Errorf("uninstall dry run removed:\n%s", after)
	}
}

func TestInstallErrorsSayWhatToFixAndChangeNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, f *fixture, o *Options)
		want  []string
	}{
		{"no node name", func(t *testing.T, f *fixture, o *Options) { delete(f.env, EnvNodeName) },
			[]string{"node name is not set", "--node-name", "NODE_NAME"}},
		{"a node name that is not one", func(t *testing.T, f *fixture, o *Options) { o.NodeName = "Node_A" },
			[]string{`node name "Node_A" is not a Kubernetes node name`}},
		{"a missing source binary", func(t *testing.T, f *fixture, o *Options) { must(t, os.Remove(filepath.Join(f.src, "galactic-bgp"))) },
			[]string{"source binary", "galactic-bgp is missing", "pass --source-dir"}},
		{"no service account token", func(t *testing.T, f *fixture, o *Options) { must(t, os.Remove(f.token)) },
			[]string{"cannot read the service account token", "--token-file", "--kubeconfig"}},
		{"no in-cluster API server address", func(t *testing.T, f *fixture, o *Options) { delete(f.env, EnvServiceHost) },
			[]string{"KUBERNETES_SERVICE_HOST", "--api-server"}},
		{"a relative path", func(t *testing.T, f *fixture, o *Options) { o.CNIBinDir = "opt/cni/bin" },
			[]string{"--cni-bin-dir", "must be an absolute path"}},
		{"an unwritable CNI bin dir", func(t *testing.T, f *fixture, o *Options) {
			if os.Geteuid() == 0 {
				t.Skip("root writes into a 0555 directory; the integration test uses a read-only mount instead")
			}
			must(t, os.MkdirAll(f.path("/opt/cni/bin"), 0o755))
			must(t, os.Chmod(f.path("/opt/cni/bin"), 0o555))
			t.Cleanup(func() { os.Chmod(f.path("/opt/cni/bin"), 0o755) })
		}, []string{"is not writable", "--cni-bin-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			o := f.options()
			tc.setup(t, f, &o)
			before := harness.Tree(t, f.root, true)
			err := Install(o)
			if err == nil {
				t.Fatal("install succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if after := harness.Tree(t, f.root, true); after != before {
				t.Errorf("a failed install changed the root:\n%s", after)
			}
		})
	}
}

func TestAGivenKubeconfigIsFlattenedSoItWorksWhereverItIsPut(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("the CA"), 0o644))
	src := clientcmdapi.NewConfig()
	src.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://api.example:6443", CertificateAuthority: "ca.crt"}
	src.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "admin-token"}
	src.AuthInfos["other"] = &clientcmdapi.AuthInfo{Token: "not-this-one"}
	src.Contexts["ctx"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	src.CurrentContext = "ctx"
	must(t, clientcmd.WriteToFile(*src, filepath.Join(dir, "kubeconfig")))
	must(t, os.Remove(f.token)) // not needed with --kubeconfig

	o := f.options()
	o.SourceKubeconfig = filepath.Join(dir, "kubeconfig")
	must(t, Install(o))
	data, err := os.ReadFile(f.path("/etc/galactic/kubeconfig"))
	must(t, err)
	if bytes.Contains(data, []byte("not-this-one")) {
		t.Error("the copy keeps users of other contexts")
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	must(t, err)
	if cfg.Host != "https://api.example:6443" || string(cfg.CAData) != "the CA" || cfg.BearerToken != "admin-token" {
		t.Errorf("flattened kubeconfig: host %q CA %q token %q", cfg.Host, cfg.CAData, cfg.BearerToken)
	}
	if _, err := os.Stat(f.path("/etc/galactic/token")); err == nil {
		t.Error("no token copy is written for a given kubeconfig")
	}
}

func TestRunRewritesTheKubeconfigWhenTheTokenRotates(t *testing.T) {
	f := newFixture(t)
	must(t, Install(f.options()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	o := f.options()
	o.Out = io.Discard // Run writes from its own goroutine
	go func() { done <- Run(ctx, o, 5*time.Millisecond, time.Minute) }()

	token2 := podToken("node-a", 2)
	must(t, os.WriteFile(f.token, []byte(token2), 0o600))
	waitFor(t, "the kubeconfig to carry token-2", func() bool {
		cfg, err := clientcmd.BuildConfigFromFlags("", f.path("/etc/galactic/kubeconfig"))
		return err == nil && cfg.BearerToken == token2
	})
	if tok, _ := os.ReadFile(f.path("/etc/galactic/token")); string(tok) != token2 {
		t.Errorf("token copy %q", tok)
	}
	if st, _ := os.Stat(f.path("/etc/galactic/kubeconfig")); st.Mode().Perm() != 0o600 {
		t.Errorf("rewritten kubeconfig mode %s", st.Mode())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
}

func TestRunGivesUpOnceTheTokenHasBeenGoneLongerThanTheGrace(t *testing.T) {
	f := newFixture(t)
	must(t, Install(f.options()))
	must(t, os.Remove(f.token))
	o := f.options()
	err := Run(context.Background(), o, time.Millisecond, 20*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "cannot read the service account token") {
		t.Fatalf("want a failure naming the token, got %v", err)
	}
}

func TestRunNeverCreatesAKubeconfigInstallDidNotWrite(t *testing.T) {
	f := newFixture(t)
	err := Run(context.Background(), f.options(), time.Millisecond, 5*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "run `galactic-installer install` first") {
		t.Fatalf("want an error that says to install first, got %v", err)
	}
	if _, err := os.Stat(f.path("/etc/galactic")); err == nil {
		t.Error("run created /etc/galactic")
	}
}

func TestTheInstallRecordIsSortedAndUnique(t *testing.T) {
	r := record{Files: []string{"/b", "/a"}}.merge([]string{"/a", "/c"}, []string{"/d"})
	got, _ := json.Marshal(r)
	if string(got) != `{"files":["/a","/b","/c"],"directories":["/d"]}` {
		t.Errorf("merged record %s", got)
	}
	o := Options{Root: "/host"}
	if got := o.reroot([]string{"/../../etc/passwd", "opt/x"}); strings.Join(got, " ") != "/host/etc/passwd /host/opt/x" {
		t.Errorf("recorded paths must stay under the root: %v", got)
	}
	if got := o.unroot([]string{"/host/opt/cni/bin/galactic-cni"}); got[0] != "/opt/cni/bin/galactic-cni" {
		t.Errorf("unroot: %v", got)
	}
	if d := reversed([]string{"/x", "/x/y", "/a"}); strings.Join(d, " ") != "/x/y /x /a" {
		t.Errorf("removal order %v: children must come before parents", d)
	}
}

// waitFor polls cond for a bounded time; it asserts an outcome, not a speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

const testConflist = `{"cniVersion":"1.1.0","name":"galactic","plugins":[{"type":"galactic-cni","routing":"table"},{"type":"galactic-bgp"}]}`

func TestInstallWritesTheConflistLastAndUninstallRemovesItFirst(t *testing.T) {
	f := newFixture(t)
	src := filepath.Join(filepath.Dir(f.src), "cm", "10-galactic.conflist")
	must(t, os.MkdirAll(filepath.Dir(src), 0o755))
	must(t, os.WriteFile(src, []byte(testConflist), 0o644))
	o := f.options()
	o.ConflistSource = src
	must(t, Install(o))
	got, err := os.ReadFile(f.path("/etc/cni/net.d/10-galactic.conflist"))
	if err != nil || string(got) != testConflist {
		t.Fatalf("installed conflist %q, %v; want the ConfigMap's", got, err)
	}
	out := f.out.String()
	if strings.Index(out, "10-galactic.conflist") < strings.Index(out, "node.json") {
		t.Fatalf("the conflist was written before the node settings:\n%s", out)
	}
	f.out.Reset()
	must(t, Install(o))
	if !strings.Contains(f.out.String(), "nothing changed") {
		t.Fatalf("second install changed something:\n%s", f.out.String())
	}

	f.out.Reset()
	must(t, Uninstall(f.options()))
	if _, err := os.Stat(f.path("/etc/cni/net.d/10-galactic.conflist")); !os.IsNotExist(err) {
		t.Fatalf("conflist left after uninstall: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(f.out.String()), "\n")
	first := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "remove: ") {
			first = l
			break
		}
	}
	if !strings.HasSuffix(first, "10-galactic.conflist") {
		t.Fatalf("uninstall removed %q first, want the conflist:\n%s", first, f.out.String())
	}
	if _, err := os.Stat(f.path("/etc/cni")); !os.IsNotExist(err) {
		t.Fatalf("/etc/cni that install created is left: %v", err)
	}
}

func TestABadConflistFailsInstallAndWritesNothing(t *testing.T) {
	for name, c := range map[string]struct{ data, as string }{
		"not JSON":       {`{"name":`, ""},
		"no plugins":     {`{"cniVersion":"1.1.0","name":"galactic","plugins":[]}`, ""},
		"no type":        {`{"cniVersion":"1.1.0","name":"galactic","plugins":[{"routing":"table"}]}`, ""},
		"not a conflist": {testConflist, "10-galactic.conf"},
		"a path":         {testConflist, "../10-galactic.conflist"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			src := filepath.Join(filepath.Dir(f.src), "10-galactic.conflist")
			must(t, os.WriteFile(src, []byte(c.data), 0o644))
			o := f.options()
			o.ConflistSource, o.ConflistName = src, c.as
			err := Install(o)
			if err == nil || !strings.Contains(err.Error(), "conflist") {
				t.Fatalf("Install = %v, want an error naming the conflist", err)
			}
			entries, _ := os.ReadDir(f.root)
			if len(entries) != 0 {
				t.Fatalf("a failed install wrote %v", entries)
			}
		})
	}
}
