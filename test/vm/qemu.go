package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// QEMUBinary is the emulator Boot runs.
const QEMUBinary = "qemu-system-x86_64"

// QEMU returns the path of qemu-system-x86_64.
func QEMU() (string, error) {
	p, err := exec.LookPath(QEMUBinary)
	if err != nil {
		return "", fmt.Errorf("%s is not installed (Debian: apt-get install --no-install-recommends qemu-system-x86)", QEMUBinary)
	}
	return p, nil
}

// KVM returns an error saying why /dev/kvm cannot boot an ordinary
// kernel: it is missing, or it is not backed by hardware virtualization
// (kvm_intel or kvm_amd). Some nested hosts offer a /dev/kvm (kvm_pvm, for
// example) that runs only specially built guest kernels; a stock kernel
// hangs there during early boot.
func KVM() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("KVM is not available: %w", err)
	}
	f.Close()
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat(filepath.Join("/sys/module", m)); err == nil {
			return nil
		}
	}
	return errors.New("/dev/kvm is not backed by kvm_intel or kvm_amd, so it cannot boot a stock kernel")
}

// Accelerators Boot can use.
const (
	AccelKVM = "kvm"
	// AccelTCG is qemu's emulator: slower, and works everywhere.
	AccelTCG = "tcg"
)

// Accelerator picks KVM when KVM can boot a stock kernel, else TCG, and
// says why. GALACTIC_VM_ACCEL (kvm or tcg) overrides the choice.
func Accelerator() (accel, why string) {
	switch a := os.Getenv("GALACTIC_VM_ACCEL"); a {
	case AccelKVM, AccelTCG:
		return a, "GALACTIC_VM_ACCEL=" + a
	}
	if err := KVM(); err != nil {
		return AccelTCG, err.Error()
	}
	return AccelKVM, "/dev/kvm is usable"
}

// BootOptions say what to boot and for how long at most.
type BootOptions struct {
	// Kernel is the vmlinuz and Initrd the image (Image.Write) to boot.
	Kernel string
	Initrd string
	// Accel is AccelKVM or AccelTCG; empty picks with Accelerator.
	Accel string
	// MemoryMB defaults to 1024.
	MemoryMB int
	// Timeout is a hard limit after which qemu is killed; default 2 minutes.
	Timeout time.Duration
	// Console, when set, also gets the serial console as it arrives.
	Console io.Writer
}

// Result is what a boot showed on the serial console.
type Result struct {
	// Log is the serial console, with carriage returns removed.
	Log string
	// Release is the kernel release /init reported; empty if /init never ran.
	Release string
	// Exit is the command's exit status; -1 when /init never reported one.
	Exit     int
	TimedOut bool
	// Accel is the accelerator qemu ran with.
	Accel    string
	Duration time.Duration
}

// Err says why the run did not succeed; nil when the command exited 0.
func (r *Result) Err() error {
	switch {
	case r.Release == "" && r.TimedOut:
		return fmt.Errorf("the VM did not reach /init within %s", r.Duration.Round(time.Second))
	case r.Release == "":
		return errors.New("the VM stopped before /init ran (see the console for a kernel panic)")
	case r.Exit < 0 && r.TimedOut:
		return fmt.Errorf("the command in the VM did not finish within %s", r.Duration.Round(time.Second))
	case r.Exit < 0:
		return errors.New("the VM stopped before its command finished (see the console for a kernel panic)")
	case r.Exit != 0:
		return fmt.Errorf("the command in the VM exited with status %d", r.Exit)
	}
	return nil
}

var goTestLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)

// GoTests returns the outcome (PASS, FAIL or SKIP) of every test and
// subtest a `go test -v` binary reported on the console.
func (r *Result) GoTests() map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(r.Log, "\n") {
		if m := goTestLine.FindStringSubmatch(line); m != nil {
			out[m[2]] = m[1]
		}
	}
	return out
}

// Boot runs qemu with KVM, no network device and the serial console on
// stdout, and returns what the console showed. The error is for qemu
// failing to run at all; what happened inside the VM is in Result.Err.
func Boot(ctx context.Context, o BootOptions) (*Result, error) {
	qemu, err := QEMU()
	if err != nil {
		return nil, err
	}
	if o.Accel == "" {
		o.Accel, _ = Accelerator()
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 1024
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-accel", o.Accel, "-m", strconv.Itoa(o.MemoryMB),
		"-nographic", "-nic", "none", "-no-reboot",
		"-kernel", o.Kernel, "-initrd", o.Initrd,
		"-append", "console=ttyS0 panic=-1 quiet")
	cmd.WaitDelay = 5 * time.Second
	var console, stderr syncBuffer
	cmd.Stdout = io.Writer(&console)
	if o.Console != nil {
		cmd.Stdout = io.MultiWriter(&console, o.Console)
	}
	cmd.Stderr = &stderr
	start := time.Now()
	runErr := cmd.Run()
	r := parseConsole(console.String())
	r.Duration = time.Since(start)
	r.Accel = o.Accel
	r.TimedOut = ctx.Err() != nil
	if runErr != nil && !r.TimedOut {
		return r, fmt.Errorf("%s: %w: %s", QEMUBinary, runErr, strings.TrimSpace(stderr.String()))
	}
	return r, nil
}

// parseConsole finds /init's markers in the console output.
func parseConsole(log string) *Result {
	r := &Result{Log: strings.ReplaceAll(log, "\r", ""), Exit: -1}
	sc := bufio.NewScanner(strings.NewReader(r.Log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if _, rest, ok := strings.Cut(line, MarkerBooted); ok {
			r.Release = strings.TrimSpace(rest)
		}
		if _, rest, ok := strings.Cut(line, MarkerExit); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
				r.Exit = n
			}
		}
	}
	return r
}

// syncBuffer is a bytes.Buffer safe for the copier goroutine and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
