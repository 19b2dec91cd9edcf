package gc

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/galactic-cni/galactic/pkg/state"
)

// sighting is a tap seen detached, by ifindex and the pass that saw it.
type sighting struct {
	Index int   `json:"ifindex"`
	Pass  int64 `json:"pass"`
}

// memory is what one pass tells the next: kept in the state dir so that a
// restart neither forgets a first sighting nor counts a recreated tap.
type memory struct {
	Pass     int64               `json:"pass"`
	Detached map[string]sighting `json:"detached"`
	path     string
}

func loadMemory(stateDir string) (*memory, error) {
	m := &memory{Detached: map[string]sighting{}, path: filepath.Join(stateDir, "gc", "taps.json")}
	data, err := os.ReadFile(m.path)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, m); err != nil {
		// A corrupt memory only delays reclaim by a pass; never block the GC on it.
		return &memory{Detached: map[string]sighting{}, path: m.path}, nil
	}
	if m.Detached == nil {
		m.Detached = map[string]sighting{}
	}
	return m, nil
}

func (m *memory) save() error {
	if err := os.MkdirAll(filepath.Dir(m.path), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(m.path, data, 0o600)
}

// see records a detached sighting in this pass and reports whether the
// same tap (same ifindex) was also detached in the previous pass.
func (m *memory) see(name string, index int) (second bool) {
	prev, ok := m.Detached[name]
	m.Detached[name] = sighting{Index: index, Pass: m.Pass}
	return ok && prev.Index == index && prev.Pass == m.Pass-1
}

// forgetUnseen drops taps this pass did not see detached: a sighting
// only counts on consecutive passes.
func (m *memory) forgetUnseen() {
	for name, s := range m.Detached {
		if s.Pass != m.Pass {
			delete(m.Detached, name)
		}
	}
}
