package image

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Placeholder is the image the shipped manifests name until they are
// rendered (`make manifests`) or an overlay sets one (`images:`).
const Placeholder = "galactic.example/galactic:REPLACE_ME"

// RenderManifests copies the manifests directory src (recursively) to dst
// with every Placeholder replaced by ref, which should be by digest. It
// fails when no file names the placeholder, so a renamed image is not
// silently left unrendered.
func RenderManifests(src, dst, ref string) error {
	if strings.Contains(ref, "REPLACE_ME") || ref == "" {
		return fmt.Errorf("image: render with a real reference, not %q", ref)
	}
	replaced := 0
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		replaced += bytes.Count(b, []byte(Placeholder))
		b = bytes.ReplaceAll(b, []byte(Placeholder), []byte(ref))
		return os.WriteFile(out, b, 0o644)
	})
	if err != nil {
		return fmt.Errorf("image: rendering %s: %w", src, err)
	}
	if replaced == 0 {
		return fmt.Errorf("image: no manifest in %s names %s", src, Placeholder)
	}
	return nil
}
