package harness

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
)

// Everything the harness makes outside its own memory (processes,
// network namespaces, directories) is tracked until it is removed, so
// that a harness ended by a signal removes it all and Main can tell what
// a test left behind.
var tracked struct {
	mu    sync.Mutex
	seq   int
	items map[string]trackedItem
}

type trackedItem struct {
	seq  int
	what string
	undo func()
	// shared items outlive the tests on purpose: Main removes them
	// without reporting them.
	shared bool
}

func track(key, what string, undo func()) { trackItem(key, trackedItem{what: what, undo: undo}) }

func trackItem(key string, it trackedItem) {
	tracked.mu.Lock()
	defer tracked.mu.Unlock()
	if tracked.items == nil {
		tracked.items = map[string]trackedItem{}
	}
	tracked.seq++
	it.seq = tracked.seq
	tracked.items[key] = it
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
// gets SIGINT, SIGTERM or SIGHUP, or writes to a closed stdout or stderr
// (SIGPIPE), and then exits; before that it calls each of before. It
// returns a function that stops it.
func CleanUpOnSignal(before ...func()) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	quit := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			for _, f := range before {
				f()
			}
			left := RemoveLeftovers()
			// stderr may be the closed pipe: this is best effort.
			fmt.Fprintf(os.Stderr, "harness: %v: removed %d things it had made\n", sig, len(left))
			os.Exit(128 + int(sig.(syscall.Signal)))
		case <-quit:
		}
	}()
	return func() { signal.Stop(sigs); close(quit) }
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
	trackItem("dir "+dir, trackedItem{what: "directory " + dir, undo: func() { removeDir(dir) }, shared: true})
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
// demo, the bench, the soak): it ends when the program gets SIGINT,
// SIGTERM or SIGHUP, writes to a closed stdout or stderr (the write then
// fails instead of killing the program with SIGPIPE), or loses its parent
// (`make` or `go run` killed, which gives it SIGTERM). The program then
// removes what it made; RemoveLeftovers catches what it did not.
func SignalContext() (context.Context, context.CancelFunc) {
	if err := DieWithParent(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
}
