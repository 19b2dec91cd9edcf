package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/galactic-cni/galactic/pkg/state"
)

// file is one file install wants on the node.
type file struct {
	path string
	data []byte
	mode fs.FileMode
	// flag is the option that picks its directory, named in errors.
	flag string
}

// change is what writing a file would do.
type change int

const (
	unchanged change = iota
	create
	update
)

// compare tells whether f is already in place with the same content and mode.
func (f file) compare() (change, error) {
	st, err := os.Lstat(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return create, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cannot inspect %s: %w", f.path, err)
	}
	if !st.Mode().IsRegular() {
		return 0, fmt.Errorf("%s exists and is not a regular file: remove it or choose another path with %s", f.path, f.flag)
	}
	if st.Mode().Perm() != f.mode {
		return update, nil
	}
	old, err := os.ReadFile(f.path)
	if err != nil {
		return 0, fmt.Errorf("cannot read %s: %w", f.path, err)
	}
	if bytes.Equal(old, f.data) {
		return unchanged, nil
	}
	return update, nil
}

// write replaces the file atomically: readers and exec see the old or the
// new content, and a running binary is never overwritten in place.
func (f file) write() error {
	if err := state.WriteFileAtomic(f.path, f.data, f.mode); err != nil {
		return fmt.Errorf("cannot write %s: %w: make %s writable or choose another directory with %s", f.path, err, filepath.Dir(f.path), f.flag)
	}
	return nil
}

// missingDirs lists the directories to create for dir, parents first.
func missingDirs(dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return nil, fmt.Errorf("%s is not a directory", d)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("cannot inspect %s: %w", d, err)
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	slices.Reverse(missing)
	return missing, nil
}

// checkWritable reports, before anything is written, a directory that
// cannot take new files: the directory itself when it exists, else the
// nearest existing parent that would hold the new directories. access(2)
// sees read-only mounts even for root.
func checkWritable(dir, flag string) error {
	d := dir
	for {
		if _, err := os.Stat(d); err == nil {
			break
		}
		d = filepath.Dir(d)
	}
	if err := unix.Access(d, unix.W_OK); err != nil {
		return fmt.Errorf("directory %s is not writable (%v): make it writable (a read-write hostPath mount in a pod) or choose another directory with %s", d, err, flag)
	}
	return nil
}

// record is what install created on the node, kept so that uninstall
// removes exactly that.
type record struct {
	Files       []string `json:"files"`
	Directories []string `json:"directories"`
}

func readRecord(path string) (record, bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, fmt.Errorf("cannot read the install record %s: %w", path, err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return record{}, false, fmt.Errorf("the install record %s is not valid JSON: %w: remove the files it named by hand, then the record", path, err)
	}
	return r, true, nil
}

// merge adds files and directories to the record, sorted and unique.
func (r record) merge(files, dirs []string) record {
	union := func(a, b []string) []string {
		out := slices.Concat(a, b)
		slices.Sort(out)
		return slices.Compact(out)
	}
	return record{Files: union(r.Files, files), Directories: union(r.Directories, dirs)}
}

func (r record) encode() []byte {
	if r.Files == nil {
		r.Files = []string{}
	}
	if r.Directories == nil {
		r.Directories = []string{}
	}
	data, _ := json.MarshalIndent(r, "", "  ")
	return append(data, '\n')
}
