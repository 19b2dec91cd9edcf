package image

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func spec(created time.Time) Spec {
	return Spec{
		Files: []File{
			{Name: "usr/local/bin/b", Mode: 0o755, Data: []byte("bee")},
			{Name: "/usr/local/bin/a", Mode: 0o755, Data: []byte("ay")},
			{Name: "etc/x.json", Mode: 0o644, Data: []byte("{}")},
		},
		Env:     []string{"PATH=/usr/local/bin"},
		Created: created,
		Arch:    "amd64",
	}
}

func TestTheSameInputsGiveTheSameDigestAndAnotherTimeAnother(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	a, err := Build(spec(t0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(spec(t0))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Build(spec(t0.Add(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	dc, _ := c.Digest()
	if da != db {
		t.Fatalf("two builds of one spec: %s and %s", da, db)
	}
	if da == dc {
		t.Fatalf("another time gave the same digest %s", da)
	}
	mt, _ := a.MediaType()
	if mt != "application/vnd.oci.image.manifest.v1+json" {
		t.Fatalf("manifest media type %s, want OCI", mt)
	}
}

func TestTheLayerIsSortedOwnedByRootWithOneTimeAndItsParentDirectories(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	img, err := Build(spec(t0))
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(t0) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: time %s uid %d gid %d, want %s and root", h.Name, h.ModTime, h.Uid, h.Gid, t0)
		}
		names = append(names, h.Name)
	}
	want := []string{"etc/", "etc/x.json", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/a", "usr/local/bin/b"}
	if !slices.Equal(names, want) {
		t.Fatalf("layer entries %v, want %v", names, want)
	}
	cfg, _ := img.ConfigFile()
	if !cfg.Created.Time.Equal(t0) || cfg.OS != "linux" || cfg.Architecture != "amd64" || len(cfg.History) != 1 {
		t.Fatalf("config %+v", cfg)
	}
}

func TestAFileGivenTwiceOrOutsideTheRootIsRefused(t *testing.T) {
	for _, files := range [][]File{
		{{Name: "a", Data: nil}, {Name: "/a", Data: nil}},
		{{Name: "../etc/passwd"}},
	} {
		if _, err := Build(Spec{Files: files}); err == nil {
			t.Errorf("Build(%v) succeeded, want an error", files)
		}
	}
}

func TestTheArchiveIsTheSameBytesAndNamesTheImageByTagAndDigest(t *testing.T) {
	img, err := Build(spec(time.Unix(1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := ByDigest("galactic.invalid/galactic:dev", img)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, "galactic.invalid/galactic@sha256:") {
		t.Fatalf("ByDigest = %s", ref)
	}
	dir := t.TempDir()
	var archives [][]byte
	for _, n := range []string{"one.tar", "two.tar"} {
		p := filepath.Join(dir, n)
		if err := WriteArchive(p, img, "galactic.invalid/galactic:dev", ref); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
	}
	if !bytes.Equal(archives[0], archives[1]) {
		t.Fatal("two archives of one image differ")
	}
	tr := tar.NewReader(bytes.NewReader(archives[0]))
	var index []byte
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "index.json" {
			index, _ = io.ReadAll(tr)
		}
	}
	for _, want := range []string{`"io.containerd.image.name":"galactic.invalid/galactic:dev"`, `"io.containerd.image.name":"` + ref + `"`} {
		if !bytes.Contains(index, []byte(want)) {
			t.Errorf("index.json lacks %s: %s", want, index)
		}
	}
}

func TestRenderingReplacesThePlaceholderAndRefusesManifestsWithoutIt(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "crds"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(src, "ds.yaml"), []byte("image: "+Placeholder+"\n"), 0o644)
	_ = os.WriteFile(filepath.Join(src, "crds", "c.yaml"), []byte("kind: CRD\n"), 0o644)
	ref := "galactic.invalid/galactic@sha256:" + strings.Repeat("a", 64)
	if err := RenderManifests(src, dst, ref); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dst, "ds.yaml"))
	if string(b) != "image: "+ref+"\n" {
		t.Fatalf("rendered %q", b)
	}
	if _, err := os.Stat(filepath.Join(dst, "crds", "c.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := RenderManifests(filepath.Join(src, "crds"), t.TempDir(), ref); err == nil {
		t.Fatal("rendering manifests without the placeholder succeeded")
	}
	if err := RenderManifests(src, t.TempDir(), Placeholder); err == nil {
		t.Fatal("rendering with the placeholder itself succeeded")
	}
}

func TestPushWritesTheImageToARegistryAndReturnsItByDigest(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	img, err := Build(spec(time.Unix(1, 0)))
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := Push(host+"/galactic:v1", img)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ByDigest(host+"/galactic:v1", img)
	if ref != want {
		t.Fatalf("Push = %s, want %s", ref, want)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := pulled.Digest()
	if d1 != d2 {
		t.Fatalf("pulled %s, pushed %s", d2, d1)
	}
}
