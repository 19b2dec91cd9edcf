package harness

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// SandboxImage is the reference of the pause image the harness builds and
// pins as containerd's sandbox image; the registry name does not resolve,
// so a pull attempt would fail loudly rather than reach the network.
const SandboxImage = "galactic.invalid/pause:1"

// BuildSandboxImage builds the pause program as a static binary and packs
// it as the only file of a one-layer OCI image layout, written as the tar
// archive `ctr images import` reads. It returns the archive's path in dir.
func BuildSandboxImage(dir string) (string, error) {
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-o", bin, "./test/bin/pause")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the pause program: %v\n%s", err, out)
	}
	pause, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	layer, err := tarOf(map[string]tarFile{"pause": {mode: 0o755, data: pause}})
	if err != nil {
		return "", err
	}
	layerDesc := descriptor("application/vnd.oci.image.layer.v1.tar", layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": []string{"/pause"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc["digest"].(string)}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config),
		"layers":        []any{layerDesc},
	})
	manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc["annotations"] = map[string]string{
		"io.containerd.image.name":          SandboxImage,
		"org.opencontainers.image.ref.name": SandboxImage[strings.LastIndex(SandboxImage, ":")+1:],
	}
	manifestDesc["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{manifestDesc},
	})
	files := map[string]tarFile{
		"oci-layout": {mode: 0o644, data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		"index.json": {mode: 0o644, data: index},
	}
	for _, blob := range [][]byte{layer, config, manifest} {
		files["blobs/sha256/"+sum256(blob)] = tarFile{mode: 0o644, data: blob}
	}
	archive, err := tarOf(files)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pause-image.tar")
	return out, os.WriteFile(out, archive, 0o644)
}

type tarFile struct {
	mode int64
	data []byte
}

// tarOf writes files (and their parent directories) into a tar archive in
// a fixed order with a fixed time, so the same input gives the same digest.
func tarOf(files map[string]tarFile) ([]byte, error) {
	var names []string
	dirs := map[string]bool{}
	for name := range files {
		names = append(names, name)
		for d := filepath.Dir(name); d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		names = append(names, d+"/")
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, name := range names {
		h := &tar.Header{Name: name, ModTime: epoch, Format: tar.FormatPAX}
		if strings.HasSuffix(name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			f := files[name]
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, f.mode, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(files[name].data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func sum256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func descriptor(mediaType string, blob []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": "sha256:" + sum256(blob), "size": len(blob)}
}
