package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/galactic-cni/galactic/installer/image"
)

// SandboxImage is the reference of the pause image the harness builds and
// pins as containerd's sandbox image; the registry name does not resolve,
// so a pull attempt would fail loudly rather than reach the network.
const SandboxImage = "galactic.invalid/pause:1"

// BuildSandboxImage builds the pause program as a static binary and packs
// it, with the image builder `make image` uses, as the only file of a
// one-layer OCI image, written as the layout archive `ctr images import`
// reads. It returns the archive's path in dir.
func BuildSandboxImage(dir string) (string, error) {
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./test/bin/pause")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the pause program: %v\n%s", err, out)
	}
	pause, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	img, err := image.Build(image.Spec{
		Files:      []image.File{{Name: "pause", Mode: 0o755, Data: pause}},
		Entrypoint: []string{"/pause"},
		Created:    time.Unix(0, 0),
	})
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pause-image.tar")
	if err := image.WriteArchive(out, img, SandboxImage); err != nil {
		return "", fmt.Errorf("writing the pause image: %w", err)
	}
	return out, nil
}
