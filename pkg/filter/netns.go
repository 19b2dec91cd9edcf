package filter

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// goHere runs f on a thread of its own in the calling thread's network
// namespace, which the caller may leave meanwhile (a plugin enters the
// container's), and returns a channel that gets f's error.
func goHere(f func() error) <-chan error {
	done := make(chan error, 1)
	runtime.LockOSThread()
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	runtime.UnlockOSThread()
	if err != nil {
		done <- fmt.Errorf("opening the network namespace: %w", err)
		return done
	}
	go func() {
		defer unix.Close(fd)
		// Never unlocked: the thread ends with the goroutine, so nothing
		// else runs in the namespace it enters.
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("entering the network namespace: %w", err)
			return
		}
		done <- f()
	}()
	return done
}
