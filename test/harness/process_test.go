package harness

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The helper process of the tests below: started with this variable, the
// test binary starts `sleep` as a Process, prints its pid, and waits.
const helperEnv = "GALACTIC_HARNESS_PROCESS_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helper()
		return
	}
	os.Exit(m.Run())
}

func helper() {
	if os.Getenv(helperEnv) == "signal" {
		stop := CleanUpOnSignal()
		defer stop()
	}
	p, err := StartProcess("sleep", exec.Command("sleep", "600"), "")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	// Threads come and go: one locked by a goroutine that returns, as a
	// namespace switch that fails to switch back leaves it, ends. The
	// child's parent-death signal is tied to the thread that started it,
	// which must not be such a one.
	for range 20 {
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtimeLockAndExit()
		}()
		<-done
	}
	fmt.Println(p.Pid())
	select {}
}

// startHelper runs the helper and returns it with its sleep's pid.
func startHelper(t *testing.T, mode string) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("the helper said %q (%v)", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return cmd, pid
}

// gone waits until process pid no longer runs (a zombie counts as gone).
func gone(t *testing.T, pid int) {
	t.Helper()
	Eventually(t, 10*time.Second, fmt.Sprintf("process %d gone", pid), func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
			return nil
		}
		return fmt.Errorf("still running: %s", b)
	})
}

func TestAProcessDiesWithTheProcessThatStartedItWhenThatIsKilled(t *testing.T) {
	cmd, pid := startHelper(t, "kill")
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the child died while its parent lived on: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	gone(t, pid)
}

func TestAProgramThatGetsSIGTERMStopsWhatItStarted(t *testing.T) {
	cmd, pid := startHelper(t, "signal")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("the helper exited with %v, want status %d", err, 128+int(syscall.SIGTERM))
	}
	gone(t, pid)
}
