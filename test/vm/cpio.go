package vm

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strings"
	"syscall"
)

// cpioWriter writes a "newc" cpio archive, the format the kernel unpacks
// as an initramfs. Parent directories are added before their entries.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	dirs map[string]bool
	err  error
}

func newCpioWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), dirs: map[string]bool{"": true, ".": true, "/": true}}
}

// entry writes one header, the name and size bytes of data from r.
func (c *cpioWriter) entry(name string, mode uint32, size int64, rdev [2]uint32, r io.Reader) {
	if c.err != nil {
		return
	}
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if name != "TRAILER!!!" {
		c.parents(name)
	}
	c.ino++
	nlink := 1
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev[0], rdev[1], len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad(int64(len(hdr) + len(name) + 1))
	if r != nil {
		n, err := io.CopyN(c.w, r, size)
		if err != nil && c.err == nil {
			c.err = fmt.Errorf("writing %s (%d of %d bytes): %w", name, n, size, err)
		}
	}
	c.pad(size)
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad aligns the archive to four bytes after n bytes of a field.
func (c *cpioWriter) pad(n int64) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) parents(name string) {
	dir := path.Dir(name)
	if c.dirs[dir] {
		return
	}
	c.Dir(dir)
}

// Dir adds a directory (and its parents).
func (c *cpioWriter) Dir(name string) {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	if c.dirs[name] {
		return
	}
	c.parents(name)
	c.dirs[name] = true
	c.entry(name, syscall.S_IFDIR|0o755, 0, [2]uint32{}, nil)
}

// File adds a regular file of size bytes read from r.
func (c *cpioWriter) File(name string, perm uint32, size int64, r io.Reader) {
	c.entry(name, syscall.S_IFREG|perm, size, [2]uint32{}, r)
}

// Symlink adds a symbolic link to target.
func (c *cpioWriter) Symlink(name, target string) {
	c.entry(name, syscall.S_IFLNK|0o777, int64(len(target)), [2]uint32{}, strings.NewReader(target))
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) {
	c.entry(name, syscall.S_IFCHR|perm, 0, [2]uint32{major, minor}, nil)
}

// Close writes the trailer and flushes; it reports the first error.
func (c *cpioWriter) Close() error {
	c.entry("TRAILER!!!", 0, 0, [2]uint32{}, nil)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
