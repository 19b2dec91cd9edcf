package state

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// AttachmentHint is what the last ADD on this node of a VPCAttachment
// read of it: its UID and data-plane names. The next ADD of the same
// attachment (a restart or an upgrade in place) names the attachment's
// lease from it and reads the lease while it reads the attachment; only
// a hint the attachment just read confirms is used, so a stale one costs
// a read and nothing else.
type AttachmentHint struct {
	UID        string `json:"uid"`
	VPC        string `json:"vpc"`
	Attachment string `json:"attachment"`
}

// Hints keeps one AttachmentHint per VPCAttachment under
// <stateDir>/attachments; galactic-gc prunes those of attachments no
// longer on the node.
type Hints struct {
	Dir string
}

// NewHints returns the hints of a state dir.
func NewHints(stateDir string) Hints {
	return Hints{Dir: filepath.Join(stateDir, "attachments")}
}

// path is attachments/<namespace>_<name>.json: neither a namespace nor an
// object name can contain "_" or "/".
func (h Hints) path(namespace, name string) (string, bool) {
	for _, v := range []string{namespace, name} {
		if v == "" || strings.ContainsAny(v, "_/\x00") || strings.HasPrefix(v, ".") {
			return "", false
		}
	}
	return filepath.Join(h.Dir, namespace+"_"+name+".json"), true
}

// Get returns the hint of namespace/name; ok is false without a usable one.
func (h Hints) Get(namespace, name string) (hint AttachmentHint, ok bool) {
	p, ok := h.path(namespace, name)
	if !ok {
		return AttachmentHint{}, false
	}
	data, err := os.ReadFile(p)
	if err != nil || json.Unmarshal(data, &hint) != nil || hint.UID == "" {
		return AttachmentHint{}, false
	}
	return hint, true
}

// Put records the hint of namespace/name. An unchanged hint is not
// rewritten, only marked as used now (Touch).
func (h Hints) Put(namespace, name string, hint AttachmentHint) error {
	p, ok := h.path(namespace, name)
	if !ok {
		return nil
	}
	if cur, ok := h.Get(namespace, name); ok && cur == hint {
		return h.Touch(namespace, name)
	}
	if err := os.MkdirAll(h.Dir, 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(hint)
	if err != nil {
		return err
	}
	return WriteFileAtomic(p, data, 0o600)
}

// Touch marks the hint of namespace/name as used now, for Prune.
func (h Hints) Touch(namespace, name string) error {
	p, ok := h.path(namespace, name)
	if !ok {
		return nil
	}
	now := time.Now()
	return os.Chtimes(p, now, now)
}

// Prune removes the hints last used before cutoff whose UID keep does not
// report in use, and returns how many went.
func (h Hints) Prune(cutoff time.Time, keep func(uid string) bool) (int, error) {
	entries, err := os.ReadDir(h.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(cutoff) {
			continue
		}
		p := filepath.Join(h.Dir, e.Name())
		var hint AttachmentHint
		if data, err := os.ReadFile(p); err == nil && json.Unmarshal(data, &hint) == nil && hint.UID != "" && keep(hint.UID) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}
