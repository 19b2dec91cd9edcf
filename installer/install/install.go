package install

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/libcni"

	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

// Directory modes for what install creates: the state dir holds node-local
// records only root should change.
const (
	dirMode      fs.FileMode = 0o755
	stateDirMode fs.FileMode = 0o700
)

// Install puts the plugins, node settings and kubeconfig on the node. Every
// input is read and every target directory checked before the first write,
// so a bad input changes nothing.
func Install(o Options) (err error) {
	o = o.withDefaults()
	p, err := o.resolve()
	if err != nil {
		return err
	}
	if err := o.validateNode(); err != nil {
		return err
	}
	if err := checkRoot(o.Root); err != nil {
		return err
	}
	files, err := o.desiredFiles(p)
	if err != nil {
		return err
	}

	// Directories to create, parents first; the state dir gets its own mode.
	var dirs []string
	var need []string
	for _, f := range files {
		need = append(need, filepath.Dir(f.path))
	}
	for _, d := range append(need, p.stateDir, filepath.Dir(p.logFile)) {
		missing, err := missingDirs(d)
		if err != nil {
			return fmt.Errorf("cannot create %s: %w", d, err)
		}
		for _, m := range missing {
			if !slices.Contains(dirs, m) {
				dirs = append(dirs, m)
			}
		}
	}

	changes := make([]change, len(files))
	for i, f := range files {
		if changes[i], err = f.compare(); err != nil {
			return err
		}
	}
	for i, f := range files {
		if changes[i] != unchanged {
			if err := checkWritable(filepath.Dir(f.path), f.flag); err != nil {
				return fmt.Errorf("cannot install %s: %w", f.path, err)
			}
		}
	}
	for _, d := range dirs {
		if err := checkWritable(filepath.Dir(d), "--root"); err != nil {
			return fmt.Errorf("cannot create %s: %w", d, err)
		}
	}
	if slices.ContainsFunc(changes, func(c change) bool { return c != unchanged }) {
		// The install record goes into the state dir.
		if err := checkWritable(p.stateDir, "--state-dir"); err != nil {
			return fmt.Errorf("cannot keep the install record %s: %w", p.manifest, err)
		}
	}

	out := o.out()
	prefix := ""
	if o.DryRun {
		prefix = "would "
	}
	var created, written []string
	// Whatever was written before a failure stays on the record, so
	// uninstall can still remove it.
	defer func() {
		if o.DryRun || len(created)+len(written) == 0 {
			return
		}
		if rerr := o.updateRecord(p, written, created); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	for _, d := range dirs {
		fmt.Fprintf(out, "%screate directory: %s\n", prefix, d)
		if o.DryRun {
			continue
		}
		mode := dirMode
		if d == p.stateDir {
			mode = stateDirMode
		}
		if err := os.Mkdir(d, mode); err != nil {
			return fmt.Errorf("cannot create %s: %w", d, err)
		}
		// Mkdir's mode is filtered by the umask; the result must not depend on it.
		if err := os.Chmod(d, mode); err != nil {
			return err
		}
		created = append(created, d)
	}
	nchanged := 0
	for i, f := range files {
		switch changes[i] {
		case unchanged:
			fmt.Fprintf(out, "unchanged: %s\n", f.path)
			continue
		case create:
			fmt.Fprintf(out, "%sinstall: %s\n", prefix, f.path)
		case update:
			fmt.Fprintf(out, "%supdate: %s\n", prefix, f.path)
		}
		nchanged++
		if o.DryRun {
			continue
		}
		if err := f.write(); err != nil {
			return err
		}
		written = append(written, f.path)
	}
	switch {
	case o.DryRun:
		fmt.Fprintf(out, "dry run: nothing written (%d files and %d directories would change)\n", nchanged, len(dirs))
	case nchanged == 0 && len(dirs) == 0:
		fmt.Fprintf(out, "install: nothing changed, %s is installed for node %s\n", p.nodeConfig, o.NodeName)
	default:
		fmt.Fprintf(out, "install: wrote %d files and created %d directories for node %s\n", nchanged, len(dirs), o.NodeName)
	}
	return nil
}

// desiredFiles reads every input and returns the files in write order: the
// node settings last, so a plugin that finds them finds everything they name.
func (o Options) desiredFiles(p paths) ([]file, error) {
	var files []file
	for _, name := range Binaries() {
		src := filepath.Join(o.SourceDir, name)
		st, err := os.Stat(src)
		if err == nil && !st.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err != nil {
			return nil, fmt.Errorf("source binary %s is missing (%v): pass --source-dir with the directory that holds %s", src, err, strings.Join(Binaries(), " and "))
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("cannot read source binary %s: %w", src, err)
		}
		files = append(files, file{path: filepath.Join(p.cniBin, name), data: data, mode: 0o755, flag: "--cni-bin-dir"})
	}
	creds, err := o.buildCredentials(p)
	if err != nil {
		return nil, err
	}
	files = append(files, credentialFiles(p, creds)...)
	router, ok, err := o.routerFile(p)
	switch {
	case err != nil:
		return nil, err
	case ok:
		files = append(files, router)
	default:
		what := "not written, galactic-router is not configured"
		if _, err := os.Stat(p.routerConfig); err == nil {
			what = "kept as it is"
		}
		fmt.Fprintf(o.out(), "router: no --router-* flag and no --router-config-file: %s %s\n", p.routerConfig, what)
	}
	node, err := json.MarshalIndent(settings.Node{
		NodeName:   o.NodeName,
		Kubeconfig: p.kubeconfig,
		Namespace:  o.Namespace,
		StateDir:   p.stateDir,
		LogFile:    p.logFile,

		RequireAttachmentObjects: o.RequireAttachmentObjects,
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	files = append(files, file{path: p.nodeConfig, data: append(node, '\n'), mode: 0o644, flag: "--node-config"})
	if o.ConflistSource != "" {
		f, err := o.conflistFile(p)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// conflistFile reads and checks the network config list to install: what
// the runtime would load (a name and at least one plugin, each with a
// type), under a name the runtime loads as a list.
func (o Options) conflistFile(p paths) (file, error) {
	name := o.ConflistName
	if name != filepath.Base(name) || !strings.HasSuffix(name, ".conflist") {
		return file{}, fmt.Errorf("--conflist-name %q must be a file name ending in .conflist (the runtime loads only those as lists)", name)
	}
	data, err := os.ReadFile(o.ConflistSource)
	if err != nil {
		return file{}, fmt.Errorf("cannot read --conflist-file: %w", err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		return file{}, fmt.Errorf("--conflist-file %s is not a network config list: %w", o.ConflistSource, err)
	}
	for i, pl := range list.Plugins {
		if pl.Network == nil || pl.Network.Type == "" {
			return file{}, fmt.Errorf("--conflist-file %s: plugin %d has no type", o.ConflistSource, i)
		}
	}
	return file{path: filepath.Join(p.cniConf, name), data: data, mode: 0o644, flag: "--cni-conf-dir"}, nil
}

// credentialFiles are the token copy (first, since the kubeconfig names
// it) and the kubeconfig, both readable by root only.
func credentialFiles(p paths, c credentials) []file {
	var files []file
	if c.token != nil {
		files = append(files, file{path: p.token, data: c.token, mode: 0o600, flag: "--node-kubeconfig"})
	}
	return append(files, file{path: p.kubeconfig, data: c.kubeconfig, mode: 0o600, flag: "--node-kubeconfig"})
}

func checkRoot(root string) error {
	if root == "" {
		return nil
	}
	st, err := os.Stat(root)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("--root %s is not a directory: create it first or pass another", root)
	}
	return nil
}

func (o Options) updateRecord(p paths, written, created []string) error {
	old, _, err := readRecord(p.manifest)
	if err != nil {
		return err
	}
	r := old.merge(o.unroot(written), o.unroot(created))
	f := file{path: p.manifest, data: r.encode(), mode: 0o644, flag: "--state-dir"}
	if c, err := f.compare(); err == nil && c == unchanged {
		return nil
	}
	return f.write()
}

// Uninstall removes the files install wrote and the directories it created
// once they are empty, as listed in the install record; anything else,
// including what the plugins wrote into the state dir, stays.
func Uninstall(o Options) error {
	o = o.withDefaults()
	p, err := o.resolve()
	if err != nil {
		return err
	}
	out := o.out()
	r, ok, err := readRecord(p.manifest)
	if err != nil {
		return err
	}
	if !ok {
		fmt.Fprintf(out, "nothing to uninstall: no install record at %s (pass the --root and --state-dir install used)\n", p.manifest)
		return nil
	}
	// The record holds host paths; under this run's root they may sit
	// elsewhere than at install time (a debug pod with the host at /host).
	r.Files, r.Directories = o.reroot(r.Files), o.reroot(r.Directories)
	// The router withdraws its routes and removes its kernel state while
	// its config and the node settings are still there.
	o.drainRouter(p)
	o.removeFilter()
	prefix := ""
	if o.DryRun {
		prefix = "would "
	}
	// The network config goes first: from then on the runtime starts no
	// pod with plugins that are about to disappear.
	cniConf := p.cniConf + string(filepath.Separator)
	slices.SortStableFunc(r.Files, func(a, b string) int {
		ac, bc := strings.HasPrefix(a, cniConf), strings.HasPrefix(b, cniConf)
		switch {
		case ac && !bc:
			return -1
		case bc && !ac:
			return 1
		}
		return 0
	})
	var left []string
	var errs []error
	for _, path := range r.Files {
		st, err := os.Lstat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			fmt.Fprintf(out, "already gone: %s\n", path)
			continue
		case err != nil:
			errs = append(errs, err)
			left = append(left, path)
			continue
		case !st.Mode().IsRegular():
			fmt.Fprintf(out, "kept: %s (no longer the regular file install wrote)\n", path)
			continue
		}
		fmt.Fprintf(out, "%sremove: %s\n", prefix, path)
		if o.DryRun {
			continue
		}
		if err := os.Remove(path); err != nil {
			errs = append(errs, fmt.Errorf("cannot remove %s: %w: make %s writable and run uninstall again", path, err, filepath.Dir(path)))
			left = append(left, path)
		}
	}
	if o.DryRun {
		for _, d := range reversed(r.Directories) {
			fmt.Fprintf(out, "would remove directory (if empty): %s\n", d)
		}
		fmt.Fprintln(out, "dry run: nothing removed")
		return nil
	}
	if len(errs) > 0 {
		// Keep what is left on the record so another uninstall can finish.
		rest := record{Files: o.unroot(left), Directories: o.unroot(r.Directories)}
		if err := state.WriteFileAtomic(p.manifest, rest.encode(), 0o644); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	if err := os.Remove(p.manifest); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot remove the install record %s: %w", p.manifest, err)
	}
	fmt.Fprintf(out, "remove: %s\n", p.manifest)
	for _, d := range reversed(r.Directories) {
		err := os.Remove(d)
		switch {
		case err == nil:
			fmt.Fprintf(out, "remove directory: %s\n", d)
		case errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
			fmt.Fprintf(out, "kept directory: %s (holds files install did not write)\n", d)
		default:
			errs = append(errs, fmt.Errorf("cannot remove directory %s: %w", d, err))
		}
	}
	for _, d := range ownDirs(p, r.Directories) {
		if os.Remove(d) == nil {
			fmt.Fprintf(out, "remove directory: %s\n", d)
		}
	}
	if len(errs) == 0 {
		fmt.Fprintln(out, "uninstall: done")
	}
	return errors.Join(errs...)
}

// ownDirs are the directories named galactic that hold what install
// writes but that install did not make: the DaemonSet's hostPaths
// (DirectoryOrCreate) make them before it runs. One that is empty after
// uninstall is still galactic's to remove.
func ownDirs(p paths, made []string) []string {
	var out []string
	for _, f := range []string{p.nodeConfig, p.kubeconfig, p.routerConfig, p.logFile, p.manifest} {
		d := filepath.Dir(f)
		if filepath.Base(d) == "galactic" && !slices.Contains(made, d) && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return reversed(out)
}

// reversed sorts directories children first, so each is empty of install's
// own subdirectories when its turn comes.
func reversed(dirs []string) []string {
	out := slices.Clone(dirs)
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// unroot turns paths under the root into the host paths they stand for.
func (o Options) unroot(paths []string) []string {
	root := filepath.Join("/", o.Root)
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			rel = p
		}
		out = append(out, filepath.Join("/", rel))
	}
	return out
}

// reroot puts recorded host paths under the root. Cleaning each as an
// absolute path first keeps a tampered "../" entry inside the root.
func (o Options) reroot(paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, filepath.Join("/", o.Root, filepath.Join("/", p)))
	}
	return out
}
