package vm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/galactic-cni/galactic/test/harness"
)

// KernelMetaPackage is the Debian package whose dependency names the
// current kernel image package.
const KernelMetaPackage = "linux-image-amd64"

// ErrNoKernelSource means the cache holds no kernel and there is no apt-get
// to fetch one: the machine is not Debian-like.
var ErrNoKernelSource = errors.New("no Debian kernel in the cache and no apt-get to fetch one (the VM tests need a Debian-like host)")

// CacheDir is where kernels and busybox are kept between runs.
func CacheDir() string { return filepath.Join(harness.CacheDir(), "vm") }

// Module is a loadable kernel module kept in the cache.
type Module struct {
	// Name is the module's name as the kernel knows it (underscores).
	Name string `json:"name"`
	// Path is the .ko file (uncompressed) on the host.
	Path    string   `json:"path"`
	Depends []string `json:"depends,omitempty"`
}

// Kernel is a Debian kernel image with the modules a test asked for.
type Kernel struct {
	Package string `json:"package"`
	// Release is what `uname -r` says inside the VM.
	Release string `json:"release"`
	// Image is the vmlinuz on the host.
	Image string `json:"image"`
	// Modules are in load order: each after the modules it depends on.
	Modules []Module `json:"modules"`
	// Builtin are the asked-for modules the image has built in.
	Builtin []string `json:"builtin,omitempty"`
}

// has reports whether k provides every module in names.
func (k *Kernel) has(names []string) bool {
	for _, n := range names {
		n = moduleName(n)
		found := false
		for _, m := range k.Modules {
			found = found || m.Name == n
		}
		for _, b := range k.Builtin {
			found = found || b == n
		}
		if !found {
			return false
		}
	}
	return true
}

// moduleName is the kernel's spelling of a module name.
func moduleName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// EnsureKernel returns the current Debian kernel (the package
// KernelMetaPackage depends on) with the named modules and every module
// they depend on, fetching the package with `apt-get download` the first
// time. When apt cannot say which kernel is current (no package lists), the
// newest cached kernel is used. progress gets a line per download.
func EnsureKernel(modules []string, progress io.Writer) (*Kernel, error) {
	dir := CacheDir()
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	pkg, err := resolveKernelPackage()
	if err != nil {
		cached := newestCachedKernel(dir)
		switch {
		case cached != "":
			pkg = cached
		case errors.Is(err, exec.ErrNotFound):
			return nil, ErrNoKernelSource
		default:
			return nil, err
		}
	}
	kdir := filepath.Join(dir, pkg)
	k, err := loadKernel(kdir)
	if err == nil && k.has(modules) {
		return k, nil
	}
	if err == nil {
		// Keep what other tests asked for, so callers with different
		// module lists do not refetch the package in turn.
		for _, m := range k.Modules {
			modules = append(modules, m.Name)
		}
		modules = append(modules, k.Builtin...)
	}
	modules = uniqueModules(modules)
	if progress != nil {
		fmt.Fprintf(progress, "fetching %s with apt-get download (first run only)...\n", pkg)
	}
	return fetchKernel(dir, pkg, modules)
}

// uniqueModules spells names as the kernel does, sorted, each once.
func uniqueModules(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, moduleName(n))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// resolveKernelPackage asks apt which image package the meta package
// currently depends on.
func resolveKernelPackage() (string, error) {
	out, err := exec.Command("apt-cache", "depends", KernelMetaPackage).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %w", KernelMetaPackage, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(strings.TrimLeft(sc.Text(), " |"))
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("apt knows no kernel for %s: run `apt-get update` first", KernelMetaPackage)
}

func newestCachedKernel(dir string) string {
	matches, _ := filepath.Glob(filepath.Join(dir, "linux-image-*", "kernel.json"))
	newest, pkg := int64(0), ""
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil && st.ModTime().UnixNano() > newest {
			newest, pkg = st.ModTime().UnixNano(), filepath.Base(filepath.Dir(m))
		}
	}
	return pkg
}

func loadKernel(kdir string) (*Kernel, error) {
	data, err := os.ReadFile(filepath.Join(kdir, "kernel.json"))
	if err != nil {
		return nil, err
	}
	var k Kernel
	if err := json.Unmarshal(data, &k); err != nil {
		return nil, err
	}
	// Paths are stored relative so the cache can move.
	k.Image = filepath.Join(kdir, k.Image)
	for i := range k.Modules {
		k.Modules[i].Path = filepath.Join(kdir, k.Modules[i].Path)
	}
	return &k, nil
}

// lockDir serializes cache writers across test processes.
func lockDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// aptDownload fetches pkg's .deb into dir and returns its path.
func aptDownload(dir, pkg string) (string, error) {
	args := []string{"-q"}
	if os.Geteuid() == 0 {
		// The _apt user cannot write into root's cache; download as root.
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	cmd := exec.Command("apt-get", append(args, "download", pkg)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %s (run `apt-get update` if apt cannot find it): %w\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s left %d .deb files in %s", pkg, len(debs), dir)
	}
	return debs[0], nil
}

// scanDeb calls visit for every regular file of a .deb's data archive.
func scanDeb(deb string, visit func(name string, r io.Reader) error) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb: %w", err)
	}
	tr := tar.NewReader(out)
	var verr error
	for verr == nil {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			verr = fmt.Errorf("reading %s: %w", deb, err)
			break
		}
		if h.Typeflag == tar.TypeReg {
			verr = visit(path.Clean(h.Name), tr)
		}
	}
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil && verr == nil {
		verr = fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	return verr
}

// moduleFile returns the module name of a .ko path inside a kernel
// package, and false for other files.
func moduleFile(name string) (string, bool) {
	if !strings.Contains(name, "lib/modules/") {
		return "", false
	}
	base := path.Base(name)
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst"} {
		if strings.HasSuffix(base, ext) {
			return moduleName(strings.TrimSuffix(base, ext)), true
		}
	}
	return "", false
}

// decompressModule returns a module's ELF bytes: insmod wants them plain.
func decompressModule(name string, data []byte) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(name, ".xz"):
		tool = "xz"
	case strings.HasSuffix(name, ".zst"):
		tool = "zstd"
	default:
		return data, nil
	}
	cmd := exec.Command(tool, "-dc")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompressing %s with %s: %w", name, tool, err)
	}
	return out, nil
}

// modinfoDepends reads the "depends=" entry of a module's .modinfo section.
func modinfoDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, errors.New("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, moduleName(d))
				}
			}
		}
	}
	return deps, nil
}

// fetchKernel downloads pkg and keeps its image and the closure of
// modules under dir/pkg. The package has no modules.dep (depmod writes it
// on install), so dependencies come from each module's modinfo, one pass
// over the archive per level of dependencies.
func fetchKernel(dir, pkg string, modules []string) (*Kernel, error) {
	tmp, err := os.MkdirTemp(dir, pkg+".tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	deb, err := aptDownload(tmp, pkg)
	if err != nil {
		return nil, err
	}
	out := filepath.Join(tmp, "kernel")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, err
	}

	k := &Kernel{Package: pkg}
	found := map[string]*Module{}
	var builtin map[string]bool
	var pending []string
	for _, m := range modules {
		pending = append(pending, moduleName(m))
	}
	for first := true; first || len(pending) > 0; first = false {
		want := map[string]bool{}
		for _, m := range pending {
			want[m] = true
		}
		err := scanDeb(deb, func(name string, r io.Reader) error {
			base := path.Base(name)
			switch {
			case k.Image == "" && strings.HasPrefix(name, "boot/vmlinuz-"):
				k.Release = strings.TrimPrefix(base, "vmlinuz-")
				k.Image = "vmlinuz"
				return writeFile(filepath.Join(out, k.Image), r)
			case builtin == nil && base == "modules.builtin":
				b, err := io.ReadAll(r)
				builtin = map[string]bool{}
				for _, line := range strings.Fields(string(b)) {
					if m, ok := moduleFile("lib/modules/" + line); ok {
						builtin[m] = true
					}
				}
				return err
			}
			m, ok := moduleFile(name)
			if !ok || !want[m] || found[m] != nil {
				return nil
			}
			data, err := io.ReadAll(r)
			if err == nil {
				data, err = decompressModule(base, data)
			}
			if err != nil {
				return err
			}
			deps, err := modinfoDepends(data)
			if err != nil {
				return fmt.Errorf("module %s: %w", name, err)
			}
			found[m] = &Module{Name: m, Path: m + ".ko", Depends: deps}
			return os.WriteFile(filepath.Join(out, m+".ko"), data, 0o644)
		})
		if err != nil {
			return nil, err
		}
		if k.Image == "" {
			return nil, fmt.Errorf("%s has no boot/vmlinuz-*", pkg)
		}
		var next []string
		for _, m := range pending {
			if found[m] == nil && !builtin[m] {
				return nil, fmt.Errorf("module %s is neither a .ko in %s nor built into its kernel", m, pkg)
			}
		}
		for _, m := range found {
			for _, d := range m.Depends {
				if found[d] == nil && !builtin[d] && !want[d] {
					want[d] = true
					next = append(next, d)
				}
			}
		}
		pending = next
	}

	for _, m := range modules {
		if builtin[moduleName(m)] && found[moduleName(m)] == nil {
			k.Builtin = append(k.Builtin, moduleName(m))
		}
	}
	k.Modules = loadOrder(found)
	data, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, "kernel.json"), data, 0o644); err != nil {
		return nil, err
	}
	kdir := filepath.Join(dir, pkg)
	if err := os.RemoveAll(kdir); err != nil {
		return nil, err
	}
	if err := os.Rename(out, kdir); err != nil {
		return nil, err
	}
	// Kernels apt no longer names current would only take space.
	old, _ := filepath.Glob(filepath.Join(dir, "linux-image-*"))
	for _, o := range old {
		if o != kdir && !strings.Contains(filepath.Base(o), ".tmp-") {
			_ = os.RemoveAll(o)
		}
	}
	return loadKernel(kdir)
}

// loadOrder lists modules so that each comes after its dependencies,
// otherwise by name.
func loadOrder(mods map[string]*Module) []Module {
	var names []string
	for n := range mods {
		names = append(names, n)
	}
	sort.Strings(names)
	var order []Module
	done := map[string]bool{}
	var visit func(string)
	visit = func(n string) {
		m := mods[n]
		if m == nil || done[n] {
			return
		}
		done[n] = true
		for _, d := range m.Depends {
			visit(d)
		}
		order = append(order, *m)
	}
	for _, n := range names {
		visit(n)
	}
	return order
}

func writeFile(p string, r io.Reader) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// EnsureBusybox returns a statically linked busybox: the host's when it
// has busybox-static installed, else one fetched with `apt-get download
// busybox-static` into the cache.
func EnsureBusybox(progress io.Writer) (string, error) {
	if p, err := exec.LookPath("busybox"); err == nil && isStatic(p) {
		return p, nil
	}
	dir := CacheDir()
	unlock, err := lockDir(dir)
	if err != nil {
		return "", err
	}
	defer unlock()
	cached := filepath.Join(dir, "busybox")
	if isStatic(cached) {
		return cached, nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", fmt.Errorf("no static busybox on this host (install busybox-static): %w", err)
	}
	if progress != nil {
		fmt.Fprintln(progress, "fetching busybox-static with apt-get download (first run only)...")
	}
	tmp, err := os.MkdirTemp(dir, "busybox.tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	deb, err := aptDownload(tmp, "busybox-static")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(tmp, "busybox")
	err = scanDeb(deb, func(name string, r io.Reader) error {
		if name == "bin/busybox" || name == "usr/bin/busybox" {
			return writeFile(bin, r)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if !isStatic(bin) {
		return "", fmt.Errorf("busybox-static gave no static bin/busybox")
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		return "", err
	}
	return cached, os.Rename(bin, cached)
}

// isStatic reports whether p is an ELF executable without a dynamic loader.
func isStatic(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false
		}
	}
	return f.Type == elf.ET_EXEC || f.Type == elf.ET_DYN
}
