package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Process is a long-lived child of the harness: a daemon in a node (run
// through `ip netns exec` or nsenter, which exec it), a server, a VMM. It
// runs in a process group of its own, so a signal to the harness's group
// does not reach it and Stop ends whatever it started in its group; and
// the kernel kills it when the harness process ends, however it ends.
type Process struct {
	// Name says what it is in messages.
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartProcess starts cmd as a Process, its output appended to logPath
// unless logPath is empty (cmd's own Stdout and Stderr are kept then).
func StartProcess(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	var log *os.File
	if logPath != "" {
		var err error
		if log, err = os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = log, log
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// A new session would leave the harness's reach; anything else gets a
	// group of its own.
	if !cmd.SysProcAttr.Setsid {
		cmd.SysProcAttr.Setpgid = true
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	var err error
	onSpawner(func() { err = cmd.Start() })
	if err != nil {
		if log != nil {
			log.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	key := "process " + strconv.Itoa(cmd.Process.Pid)
	// Tracked before it can be untracked; killed once waited for.
	kept := trackItem(key, trackedItem{what: fmt.Sprintf("%s (pid %d)", name, cmd.Process.Pid), undo: p.Kill})
	go func() {
		p.err = cmd.Wait()
		if log != nil {
			log.Close()
		}
		untrack(key)
		close(p.done)
	}()
	if !kept {
		p.Kill()
	}
	return p, nil
}

// Pid is the process's ID (that of the program itself: `ip netns exec`
// and nsenter exec it).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been waited for.
func (p *Process) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Err is how the process ended (nil for exit status 0); call it after
// Done is closed.
func (p *Process) Err() error { return p.err }

// Signal sends sig to the process's group.
func (p *Process) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// Stop sends sig to the process's group and waits until the process has
// exited; after grace it kills the group.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) {
	_ = p.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.Signal(syscall.SIGKILL)
		<-p.done
	}
	// What the process started in its group goes with it.
	_ = p.Signal(syscall.SIGKILL)
}

// Kill ends the process's group with SIGKILL, as a crash would, and waits
// for the process.
func (p *Process) Kill() { p.Stop(syscall.SIGKILL, 15*time.Second) }

// Terminate stops it with SIGTERM, killing it after 15 s.
func (p *Process) Terminate() { p.Stop(syscall.SIGTERM, 15*time.Second) }

// The spawner is one goroutine locked to its OS thread for the life of
// the process: a child's parent-death signal fires when the thread that
// started it exits, and Go ends other threads when a goroutine that
// locked one returns without unlocking it (as a network namespace switch
// that failed to switch back does).
var (
	spawnOnce sync.Once
	spawns    chan func()
	// hostNetns is the network namespace the harness started in, which
	// processes it starts without `ip netns exec` run in.
	hostNetns *os.File
)

func init() {
	// Package initialisation runs on the main thread, in the process's
	// own namespace.
	hostNetns, _ = os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
}

func onSpawner(f func()) {
	spawnOnce.Do(func() {
		spawns = make(chan func())
		go func() {
			runtime.LockOSThread()
			// A new thread inherits the namespace of the thread that made
			// it, which may have been inside a node at the time.
			if hostNetns != nil {
				_ = unix.Setns(int(hostNetns.Fd()), unix.CLONE_NEWNET)
			}
			for f := range spawns {
				f()
			}
		}()
	})
	done := make(chan struct{})
	spawns <- func() { f(); close(done) }
	<-done
}

// DieWithParent makes this process receive SIGTERM when its parent ends
// (`go test` or `go run` killed, `make` killed), so that a program whose
// signal handler cleans up does so instead of running on unseen. It
// returns an error when the parent is gone already.
func DieWithParent() error {
	parent := os.Getppid()
	var err error
	onSpawner(func() { err = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGTERM), 0, 0, 0) })
	if err != nil {
		return fmt.Errorf("PR_SET_PDEATHSIG: %w", err)
	}
	if os.Getppid() != parent {
		return errors.New("the parent process has ended")
	}
	return nil
}

// fileTail is the last n lines of a log file, for failure messages.
func fileTail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func splitLines(s string) []string { return strings.Split(strings.TrimRight(s, "\n"), "\n") }

// Daemon is a Process that can be stopped and started again, as a
// DaemonSet's pod is; the zero value is stopped.
type Daemon struct {
	mu   sync.Mutex
	proc *Process
}

// start starts cmd unless the daemon runs.
func (d *Daemon) start(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil && d.proc.Running() {
		return nil, fmt.Errorf("%s is already running", name)
	}
	p, err := StartProcess(name, cmd, logPath)
	if err != nil {
		return nil, err
	}
	d.proc = p
	return p, nil
}

// stop sends sig, kills it after 15 s, and waits until it has exited.
func (d *Daemon) stop(sig syscall.Signal) {
	d.mu.Lock()
	p := d.proc
	d.proc = nil
	d.mu.Unlock()
	if p != nil {
		p.Stop(sig, 15*time.Second)
	}
}

// Kill stops it with SIGKILL, as a crash would.
func (d *Daemon) Kill() { d.stop(syscall.SIGKILL) }

// Terminate stops it with SIGTERM, as an upgrade or a rollout would.
func (d *Daemon) Terminate() { d.stop(syscall.SIGTERM) }

// Pid is the running process's ID, 0 when it is stopped.
func (d *Daemon) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return 0
	}
	return d.proc.Pid()
}

// Running reports whether it was started and has not exited since.
func (d *Daemon) Running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc != nil && d.proc.Running()
}
