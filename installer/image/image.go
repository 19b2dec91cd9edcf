// Package image builds galactic's one OCI image and the other single-layer
// images the tests run (the sandbox's pause program) with
// go-containerregistry: from scratch, no daemon, no shell.
//
// The same inputs give the same digest: the layer's entries are sorted,
// every time in the layer and the config is Spec.Created, owners are root,
// and the gzip level is fixed. With binaries built by `go build -trimpath`
// from one commit by one toolchain, the image of a commit has one digest.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Binaries are the programs galactic's image holds, side by side in BinDir
// (galactic-installer copies the plugins from its own directory).
var Binaries = []string{"galactic-installer", "galactic-cni", "galactic-bgp", "galactic-gc", "galactic-router", "galactic-controller"}

// BinDir is where the image keeps its programs, and its PATH.
const BinDir = "usr/local/bin"

// File is one regular file of the layer.
type File struct {
	// Name is the path in the image, without a leading slash.
	Name string
	Mode int64
	Data []byte
}

// Spec is what an image holds.
type Spec struct {
	Files      []File
	Entrypoint []string
	Env        []string
	// Created is the time of every entry and of the config; a fixed
	// value (the commit's time, say) keeps the digest stable.
	Created time.Time
	// Arch is the GOARCH of the binaries; empty means this machine's.
	Arch string
	// Labels go into the config (org.opencontainers.image.* keys).
	Labels map[string]string
}

// Galactic is the Spec of galactic's image from the binaries in dir.
func Galactic(dir string, created time.Time) (Spec, error) {
	s := Spec{Created: created, Env: []string{"PATH=/" + BinDir}}
	for _, b := range Binaries {
		data, err := os.ReadFile(filepath.Join(dir, b))
		if err != nil {
			return Spec{}, fmt.Errorf("image: %w (run make build first)", err)
		}
		s.Files = append(s.Files, File{Name: path.Join(BinDir, b), Mode: 0o755, Data: data})
	}
	return s, nil
}

// Build makes the image: one gzip layer on an empty base, OCI media types.
func Build(s Spec) (v1.Image, error) {
	layerTar, err := layerTar(s.Files, s.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	arch := s.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	created := v1.Time{Time: s.Created.UTC()}
	base, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      created,
		Config:       v1.Config{Env: s.Env, Entrypoint: s.Entrypoint, Labels: s.Labels},
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	base = mutate.MediaType(base, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	return mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: created, CreatedBy: "galactic image build", Comment: "static binaries, no shell"},
	})
}

// layerTar writes files and their parent directories sorted by name, all
// owned by root with one time.
func layerTar(files []File, created time.Time) ([]byte, error) {
	entries := map[string]*File{}
	dirs := map[string]bool{}
	for i := range files {
		f := &files[i]
		n := path.Clean(strings.TrimPrefix(f.Name, "/"))
		if n == "." || strings.HasPrefix(n, "../") {
			return nil, fmt.Errorf("image: bad file name %q", f.Name)
		}
		if entries[n] != nil {
			return nil, fmt.Errorf("image: %s given twice", n)
		}
		entries[n] = f
		for d := path.Dir(n); d != "."; d = path.Dir(d) {
			dirs[d+"/"] = true
		}
	}
	var names []string
	for n := range entries {
		names = append(names, n)
	}
	for d := range dirs {
		names = append(names, d)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mod := created.UTC()
	for _, n := range names {
		h := &tar.Header{Name: n, ModTime: mod, Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		f := entries[n]
		if f == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, f.Mode, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if f != nil {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Push writes img to the registry repository or tag ref names, with the
// credentials of the default keychain (~/.docker/config.json and its
// helpers), and returns the reference by digest.
func Push(ref string, img v1.Image) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image: IMAGE=%q: %w", ref, err)
	}
	if err := remote.Write(r, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return "", fmt.Errorf("image: pushing %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return r.Context().Digest(d.String()).String(), nil
}

// ByDigest is repo (a name with or without tag) pinned to img's digest:
// repo@sha256:...
func ByDigest(repo string, img v1.Image) (string, error) {
	r, err := name.ParseReference(repo)
	if err != nil {
		return "", fmt.Errorf("image: %q: %w", repo, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return r.Context().Digest(d.String()).String(), nil
}
