package vm

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/galactic-cni/galactic/test/harness"
)

// Markers /init prints on the serial console, each on a line of its own.
const (
	MarkerBooted = "GALACTIC-VM: BOOTED "
	MarkerExit   = "GALACTIC-VM: EXIT "
)

// File is a file to put into the image.
type File struct {
	// Path is the absolute path inside the VM.
	Path string
	// Source is the file on the host; Data is the content when it is empty.
	Source string
	Data   []byte
	// Mode defaults to 0755.
	Mode os.FileMode
}

// Image is an initramfs whose /init mounts /proc, /sys, /dev, /run and
// /tmp, loads the kernel's modules, runs Command with Env exported and
// powers off, printing the command's exit status.
type Image struct {
	Kernel *Kernel
	// Busybox is a static busybox (EnsureBusybox): the shell and tools.
	Busybox string
	Files   []File
	// Env is exported as KEY=value before Command runs.
	Env []string
	// Command is a shell command line; its exit status is the result.
	Command string
	// Modules, when set, are the kernel's modules to load (with those
	// they depend on); empty loads every module the kernel holds.
	Modules []string
}

// modules lists what /init loads, in load order.
func (im Image) modules() []Module {
	if len(im.Modules) == 0 {
		return im.Kernel.Modules
	}
	want := map[string]bool{}
	var add func(string)
	add = func(n string) {
		n = moduleName(n)
		if want[n] {
			return
		}
		want[n] = true
		for _, m := range im.Kernel.Modules {
			if m.Name == n {
				for _, d := range m.Depends {
					add(d)
				}
			}
		}
	}
	for _, n := range im.Modules {
		add(n)
	}
	var out []Module
	for _, m := range im.Kernel.Modules {
		if want[m.Name] {
			out = append(out, m)
		}
	}
	return out
}

// Write writes the image as an uncompressed newc cpio archive to p.
func (im Image) Write(p string) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	c := newCpioWriter(f)
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "run", "tmp", "etc", "root", "var/lib", "var/log"} {
		c.Dir(d)
	}
	// The kernel opens /dev/console for /init before anything mounts /dev.
	c.CharDev("dev/console", 0o600, 5, 1)
	c.Symlink("var/run", "/run")
	files := []File{{Path: "/bin/busybox", Source: im.Busybox}}
	for _, m := range im.modules() {
		files = append(files, File{Path: im.modulePath(m), Source: m.Path, Mode: 0o644})
	}
	files = append(files, im.Files...)
	files = append(files, File{Path: "/init", Data: []byte(im.initScript())})
	for _, file := range files {
		if err := addFile(c, file); err != nil {
			f.Close()
			return err
		}
	}
	if err := c.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (im Image) modulePath(m Module) string {
	return path.Join("/lib/modules", im.Kernel.Release, m.Name+".ko")
}

func addFile(c *cpioWriter, file File) error {
	mode := uint32(file.Mode.Perm())
	if file.Mode == 0 {
		mode = 0o755
	}
	if file.Source == "" {
		c.File(file.Path, mode, int64(len(file.Data)), bytes.NewReader(file.Data))
		return nil
	}
	src, err := os.Open(file.Source)
	if err != nil {
		return err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	c.File(file.Path, mode, st.Size(), src)
	return nil
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (im Image) initScript() string {
	var b strings.Builder
	b.WriteString(`#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
finish() {
	echo
	echo "` + MarkerExit + `$1"
	poweroff -f
}
echo "` + MarkerBooted + `$(uname -r)"
`)
	mods := im.modules()
	for _, m := range mods {
		fmt.Fprintf(&b, "insmod %s || { echo \"insmod %s failed\"; finish 125; }\n", im.modulePath(m), m.Name)
	}
	if len(mods) > 0 {
		var names []string
		for _, m := range mods {
			names = append(names, m.Name)
		}
		fmt.Fprintf(&b, "echo \"GALACTIC-VM: loaded %s\"\n", strings.Join(names, " "))
	}
	for _, kv := range im.Env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	fmt.Fprintf(&b, "cd /root\n%s\nfinish $?\n", im.Command)
	return b.String()
}

// BuildStatic builds Go packages (of this module or its dependencies) as
// static binaries into dir.
func BuildStatic(dir string, pkgs ...string) error {
	return goCmd(append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
}

// BuildTestBinary compiles the tests of pkg into a static binary at out.
func BuildTestBinary(out, pkg string) error {
	return goCmd("test", "-c", "-o", out, pkg)
}

func goCmd(args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = harness.RepoRoot()
	// The VM has no C library: everything must be static.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
