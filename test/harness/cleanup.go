package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Everything the harness makes outside its own memory (processes,
// network namespaces, directories) is tracked until it is removed, so
// that a harness ended by a signal removes it all and Main can tell what
// a test left behind.
var tracked struct {
	mu    sync.Mutex
	seq   int
	items map[string]trackedItem
	// closing is set while a signal's cleanup runs: what tests make
	// meanwhile is undone at once.
	closing bool
}

type trackedItem struct {
	seq  int
	what string
	undo func()
	// shared items outlive the tests on purpose: Main removes them
	// without reporting them.
	shared bool
}

// track records what key made and how to undo it; during a signal's
// cleanup it undoes it at once instead.
func track(key, what string, undo func()) {
	if !trackItem(key, trackedItem{what: what, undo: undo}) {
		undo()
	}
}

// trackItem records it, unless a signal's cleanup runs: then it returns
// false and the caller undoes it.
func trackItem(key string, it trackedItem) bool {
	tracked.mu.Lock()
	defer tracked.mu.Unlock()
	if tracked.closing {
		return false
	}
	if tracked.items == nil {
		tracked.items = map[string]trackedItem{}
	}
	tracked.seq++
	it.seq = tracked.seq
	tracked.items[key] = it
	return true
}

func untrack(key string) {
	tracked.mu.Lock()
	defer tracked.mu.Unlock()
	delete(tracked.items, key)
}

// RemoveLeftovers removes what the harness made and nothing has removed
// yet, newest first, and says what that was, leaving out what was made to
// be shared by the tests (SharedTempDir).
func RemoveLeftovers() []string {
	tracked.mu.Lock()
	items := make([]trackedItem, 0, len(tracked.items))
	for _, it := range tracked.items {
		items = append(items, it)
	}
	tracked.items = nil
	tracked.mu.Unlock()
	slices.SortFunc(items, func(a, b trackedItem) int { return b.seq - a.seq })
	var out []string
	for _, it := range items {
		it.undo()
		if !it.shared {
			out = append(out, it.what)
		}
	}
	return out
}

// CleanUpOnSignal removes everything the harness made when the process
// gets SIGINT, SIGTERM or SIGHUP (with DieWithParent, SIGTERM also comes
// when its parent ends), and then exits. It returns a function that stops
// it.
func CleanUpOnSignal() (stop func()) {
	// A parent that ended took the reading end of stdout and stderr with
	// it, and a write there would end the process half-way (SIGPIPE):
	// the cleanup writes nowhere, and says what it did on a copy of
	// stderr, where a write only fails.
	report := dupFile(2, "stderr")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	quit := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			silenceStdio()
			tracked.mu.Lock()
			tracked.closing = true
			tracked.mu.Unlock()
			left := RemoveLeftovers()
			if report != nil {
				fmt.Fprintf(report, "harness: %v: removed %d things it had made\n", sig, len(left))
			}
			os.Exit(128 + int(sig.(syscall.Signal)))
		case <-quit:
		}
	}()
	return func() { signal.Stop(sigs); close(quit) }
}

// dupFile is a file on a copy of descriptor fd: a write to it that finds
// the reader gone fails (EPIPE) where one to stdout or stderr would end
// the process. Nil when fd cannot be copied.
func dupFile(fd int, name string) *os.File {
	c, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(c), name)
}

// silenceStdio points stdout and stderr at /dev/null.
func silenceStdio() {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	_ = unix.Dup2(int(null.Fd()), 1)
	_ = unix.Dup2(int(null.Fd()), 2)
	null.Close()
}

// MkdirTemp makes a directory under the system's temporary directory that
// a signal's cleanup removes; RemoveDir removes it.
func MkdirTemp(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	track("dir "+dir, "directory "+dir, func() { removeDir(dir) })
	return dir, nil
}

// SharedTempDir is MkdirTemp for a directory the tests of a package share
// (guest images built once, say): Main removes it after the tests.
func SharedTempDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if !trackItem("dir "+dir, trackedItem{what: "directory " + dir, undo: func() { removeDir(dir) }, shared: true}) {
		removeDir(dir)
		return "", errors.New("the harness is cleaning up")
	}
	return dir, nil
}

// RemoveDir removes a directory MkdirTemp made, with whatever is still
// mounted under it.
func RemoveDir(dir string) error {
	untrack("dir " + dir)
	return removeDir(dir)
}

func removeDir(dir string) error {
	for _, m := range mountsUnder(dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	return os.RemoveAll(dir)
}

// SignalContext is the context of a program built on the harness (the
// demo, the bench, the soak), and out the writer its story goes to: the
// context ends when the program gets SIGINT, SIGTERM or SIGHUP, when its
// parent ends (`make` or `go run` killed, which gives it SIGTERM), or
// when a write to out finds stdout's reader gone (`make demo | head`):
// out writes on a copy of stdout, where that write fails instead of
// ending the program (SIGPIPE). The program then removes what it made;
// RemoveLeftovers catches what it did not.
func SignalContext() (ctx context.Context, stop context.CancelFunc, out io.Writer) {
	if err := DieWithParent(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	stdout := dupFile(1, "stdout")
	if stdout == nil {
		return ctx, func() { cancel(); stopSignals() }, os.Stdout
	}
	return ctx, func() { cancel(); stopSignals() }, &guardedWriter{f: stdout, gone: cancel}
}

// guardedWriter writes to f and calls gone once a write fails.
type guardedWriter struct {
	f    *os.File
	gone func()
}

func (w *guardedWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if err != nil {
		w.gone()
	}
	return n, err
}
