// Package logging gives galactic binaries one structured JSON log: one
// object per line, appended to the node's log file.
package logging

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
)

// Open returns a JSON logger that appends to path, with attrs on every
// line, and a function that closes the file. A log file that cannot be
// opened must never fail a CNI verb, so the logger falls back to stderr
// (which the runtime captures) and says why once.
func Open(path string, attrs ...any) (*slog.Logger, func()) {
	var w io.Writer = os.Stderr
	closeFn := func() {}
	if path != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
				w = f
				closeFn = func() { f.Close() }
			}
		}
	}
	l := slog.New(slog.NewJSONHandler(w, nil)).With(attrs...)
	if w == os.Stderr && path != "" {
		l.Warn("cannot open log file; logging to stderr", "path", path)
	}
	return l, closeFn
}
