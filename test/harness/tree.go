package harness

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Tree lists every path under root with its type, mode and content digest;
// with identity it adds inode and mtime, which any rewrite changes. Two
// listings compare equal exactly when nothing under root changed.
func Tree(t testing.TB, root string, identity bool) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fmt.Fprintf(&b, "%s %s", rel, st.Mode())
		if st.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(data))
		}
		if identity {
			fmt.Fprintf(&b, " ino=%d mtime=%d", st.Sys().(*syscall.Stat_t).Ino, st.ModTime().UnixNano())
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
