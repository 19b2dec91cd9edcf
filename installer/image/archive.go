package image

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// WriteArchive writes img as an OCI image layout packed in a tar archive,
// the form `ctr images import` and `skopeo copy oci-archive:` read. The
// index lists the manifest once per name in names (full references, by
// tag or by digest), each annotated so containerd's import creates an
// image of that name: a runtime asked for repo@sha256:... then finds it
// without a registry. The archive of one image and names is always the
// same bytes.
func WriteArchive(path string, img v1.Image, names ...string) error {
	cfgFile, err := img.ConfigFile()
	if err != nil {
		return err
	}
	platform := &v1.Platform{OS: cfgFile.OS, Architecture: cfgFile.Architecture}
	var idx v1.ImageIndex = empty.Index
	for _, n := range names {
		r, err := name.ParseReference(n)
		if err != nil {
			return fmt.Errorf("image: name %q: %w", n, err)
		}
		ann := map[string]string{"io.containerd.image.name": r.Name()}
		if t, ok := r.(name.Tag); ok {
			ann["org.opencontainers.image.ref.name"] = t.TagStr()
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: platform, Annotations: ann},
		})
	}
	indexJSON, err := idx.RawManifest()
	if err != nil {
		return err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	mDigest, err := img.Digest()
	if err != nil {
		return err
	}
	cDigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	type entry struct {
		size int64
		open func() (io.ReadCloser, error)
	}
	bytesEntry := func(b []byte) entry {
		return entry{int64(len(b)), func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(string(b))), nil }}
	}
	entries := map[string]entry{
		"oci-layout":                 bytesEntry([]byte(`{"imageLayoutVersion":"1.0.0"}`)),
		"index.json":                 bytesEntry(indexJSON),
		blobPath(mDigest):            bytesEntry(manifest),
		blobPath(cDigest):            bytesEntry(config),
		"blobs/":                     {size: -1},
		"blobs/" + mDigest.Algorithm: {size: -1},
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		entries[blobPath(d)] = entry{size, l.Compressed}
	}
	var order []string
	for n := range entries {
		order = append(order, n)
	}
	slices.Sort(order)

	tmp, err := os.CreateTemp(filepath.Dir(path), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	tw := tar.NewWriter(tmp)
	epoch := time.Unix(0, 0).UTC()
	for _, n := range order {
		e := entries[n]
		h := &tar.Header{Name: n, ModTime: epoch, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Mode: 0o644, Size: e.size}
		if e.size < 0 {
			h.Name, h.Typeflag, h.Mode, h.Size = strings.TrimSuffix(n, "/")+"/", tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if e.open == nil {
			continue
		}
		rc, err := e.open()
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("image: writing %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
