// Package image checks `make image` as a release does: two runs from one
// checkout, what the image holds, and `make manifests`.
package image

import (
	"archive/tar"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/galactic-cni/galactic/installer/image"
	"github.com/galactic-cni/galactic/test/harness"
)

// makeImage runs `make image` (and with manifests, `make manifests`) with
// its output in a directory of its own and returns that directory.
func makeImage(t *testing.T, targets ...string) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("make", append(targets, "BIN="+bin)...)
	cmd.Dir = harness.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(targets, " "), err, out)
	}
	return bin
}

func readRef(t *testing.T, bin string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bin, "galactic-image.ref"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestMakeImageTwiceFromOneCheckoutGivesOneDigestAndTheImageHasNoShellAndNoDynamicBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary twice")
	}
	first := makeImage(t, "image")
	second := makeImage(t, "image", "manifests")
	ref1, ref2 := readRef(t, first), readRef(t, second)
	if ref1 != ref2 || !strings.Contains(ref1, "@sha256:") {
		t.Fatalf("two builds of one checkout: %s and %s, want one reference by digest", ref1, ref2)
	}
	a1, _ := os.ReadFile(filepath.Join(first, "galactic-image.tar"))
	a2, _ := os.ReadFile(filepath.Join(second, "galactic-image.tar"))
	if string(a1) != string(a2) {
		t.Fatal("the two archives differ")
	}

	files := imageFiles(t, filepath.Join(first, "galactic-image.tar"))
	var want []string
	for _, b := range image.Binaries {
		want = append(want, path.Join(image.BinDir, b))
	}
	var got []string
	for name, data := range files {
		got = append(got, name)
		if shells[path.Base(name)] {
			t.Errorf("the image holds a shell: %s", name)
		}
		if err := staticELF(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the image holds %v, want exactly %v", got, want)
	}

	// make manifests: the rendered copy names the image by digest wherever
	// the shipped one has the placeholder.
	rendered, err := os.ReadFile(filepath.Join(second, "manifests", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rendered), image.Placeholder) || !strings.Contains(string(rendered), "image: "+ref2) {
		t.Fatalf("rendered daemonset.yaml does not name %s everywhere:\n%s", ref2, rendered)
	}
}

var shells = map[string]bool{"sh": true, "bash": true, "ash": true, "dash": true, "busybox": true, "zsh": true}

// staticELF fails for anything but an ELF executable without an
// interpreter and without needed libraries.
func staticELF(data []byte) error {
	f, err := elf.NewFile(strings.NewReader(string(data)))
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return errString("dynamically linked (" + p.Type.String() + ")")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return errString("needs " + strings.Join(libs, ", "))
	}
	return nil
}

type errString string

func (e errString) Error() string { return string(e) }

// imageFiles unpacks the layout archive and returns the regular files of
// the one image it holds, by path.
func imageFiles(t *testing.T, archive string) map[string][]byte {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("tar", "-xf", archive, "-C", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", archive, err, out)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) == 0 {
		t.Fatal("empty index")
	}
	for _, m := range im.Manifests[1:] {
		if m.Digest != im.Manifests[0].Digest {
			t.Fatalf("the index names two images: %s and %s", im.Manifests[0].Digest, m.Digest)
		}
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.Config.Env, "PATH=/"+image.BinDir) {
		t.Errorf("config Env %v, want PATH=/%s", cfg.Config.Env, image.BinDir)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch h.Typeflag {
			case tar.TypeDir:
			case tar.TypeReg:
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				files[h.Name] = b
			default:
				t.Errorf("%s: entry type %q, want only files and directories", h.Name, h.Typeflag)
			}
		}
		rc.Close()
	}
	return files
}
