package v1alpha1_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/test/harness"
)

// The check runs on a copy of the API package so that the real tree is
// never touched.
func TestTheGeneratedCodeCheckFailsWhenATypeChangesWithoutMakeGenerate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds controller-gen")
	}
	gen, err := harness.EnsureTool("controller-gen", "sigs.k8s.io/controller-tools/cmd/controller-gen", nil)
	if err != nil {
		t.Fatal(err)
	}
	root := harness.RepoRoot()
	copyTree := func(dst string) {
		for _, p := range []string{"go.mod", "go.sum", "pkg/apis", "installer/manifests/crds"} {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("cp", "-r", filepath.Join(root, p), filepath.Join(dst, p)).CombinedOutput(); err != nil {
				t.Fatalf("cp %s: %v %s", p, err, out)
			}
		}
		// Only the types and their generated code: the tests are not needed.
		files, _ := filepath.Glob(filepath.Join(dst, "pkg/apis/network/v1alpha1/*_test.go"))
		for _, f := range files {
			os.Remove(f)
		}
	}
	check := func(dir string) (string, error) {
		cmd := exec.Command(filepath.Join(root, "hack", "verify-generated.sh"), dir)
		cmd.Env = append(os.Environ(), "CONTROLLER_GEN="+gen)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	clean := t.TempDir()
	copyTree(clean)
	if out, err := check(clean); err != nil {
		t.Fatalf("the committed generated files must be current: %v\n%s", err, out)
	}

	changed := t.TempDir()
	copyTree(changed)
	types := filepath.Join(changed, "pkg/apis/network/v1alpha1/types.go")
	src, _ := os.ReadFile(types)
	edited := strings.Replace(string(src), "\tHolderGeneration int64 `json:\"holderGeneration\"`",
		"\tHolderGeneration int64 `json:\"holderGeneration\"`\n\tExtra []string `json:\"extra,omitempty\"`", 1)
	if edited == string(src) {
		t.Fatal("test could not edit the type")
	}
	if err := os.WriteFile(types, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := check(changed)
	if err == nil || !strings.Contains(out, "make generate") {
		t.Fatalf("want the check to fail and name 'make generate', got %v\n%s", err, out)
	}
}
