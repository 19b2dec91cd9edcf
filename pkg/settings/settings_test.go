package settings

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadReadsTheFileThenEnvironmentThenDefaults(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.json")
	if err := os.WriteFile(path, []byte(`{"nodeName":"node-a","namespace":"from-file","stateDir":"/s"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Node
	}{
		{
			name: "file and defaults",
			env:  map[string]string{EnvConfig: path},
			want: Node{NodeName: "node-a", Kubeconfig: DefaultKubeconfig, Namespace: "from-file", StateDir: "/s", LogFile: DefaultLogFile, Path: path},
		},
		{
			name: "environment overrides the file",
			env:  map[string]string{EnvConfig: path, EnvNodeName: "node-b", EnvNamespace: "ns", EnvKubeconfig: "/k", EnvStateDir: "/st", EnvLogFile: "/l"},
			want: Node{NodeName: "node-b", Kubeconfig: "/k", Namespace: "ns", StateDir: "/st", LogFile: "/l", Path: path},
		},
		{
			name: "a missing file leaves the environment and defaults",
			env:  map[string]string{EnvConfig: filepath.Join(dir, "absent.json"), EnvNodeName: "node-c"},
			want: Node{NodeName: "node-c", Kubeconfig: DefaultKubeconfig, Namespace: DefaultNamespace, StateDir: DefaultStateDir, LogFile: DefaultLogFile, Path: filepath.Join(dir, "absent.json")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Load(env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestLoadRejectsAMalformedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.json")
	if err := os.WriteFile(path, []byte(`{"nodeName":`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(env(map[string]string{EnvConfig: path}))
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not valid JSON") {
		t.Fatalf("want an error naming the file, got %v", err)
	}
}

func TestAMissingNodeNameSaysWhereToSetIt(t *testing.T) {
	n, err := Load(env(map[string]string{EnvConfig: "/nonexistent/node.json"}))
	if err != nil {
		t.Fatal(err)
	}
	err = n.RequireNodeName()
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/node.json") || !strings.Contains(err.Error(), EnvNodeName) {
		t.Fatalf("want an error naming the file and %s, got %v", EnvNodeName, err)
	}
}

func TestRequireAttachmentObjectsComesFromTheFileOrTheEnvironmentAndIsOffByDefault(t *testing.T) {
	dir := t.TempDir()
	on := filepath.Join(dir, "on.json")
	if err := os.WriteFile(on, []byte(`{"nodeName":"node-a","requireAttachmentObjects":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"default", map[string]string{EnvConfig: filepath.Join(dir, "absent.json")}, false},
		{"file", map[string]string{EnvConfig: on}, true},
		{"environment", map[string]string{EnvConfig: filepath.Join(dir, "absent.json"), EnvRequireAttachmentObjects: "true"}, true},
		{"environment over the file", map[string]string{EnvConfig: on, EnvRequireAttachmentObjects: "false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := Load(env(tc.env))
			if err != nil || n.RequireAttachmentObjects != tc.want {
				t.Fatalf("requireAttachmentObjects %v, %v; want %v", n.RequireAttachmentObjects, err, tc.want)
			}
		})
	}
	_, err := Load(env(map[string]string{EnvConfig: on, EnvRequireAttachmentObjects: "yes please"}))
	if err == nil || !strings.Contains(err.Error(), EnvRequireAttachmentObjects) {
		t.Fatalf("want an error naming %s, got %v", EnvRequireAttachmentObjects, err)
	}
}
