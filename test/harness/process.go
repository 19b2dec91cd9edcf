package harness

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// stopProcess sends sig and waits for done (closed when the process has
// been waited for), killing it when grace passes first.
func stopProcess(p *os.Process, done <-chan struct{}, sig syscall.Signal, grace time.Duration) {
	_ = p.Signal(sig)
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.Kill()
		<-done
	}
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

// startLogged starts cmd with its output appended to logPath; done closes
// once it has exited and the log is closed.
func startLogged(cmd *exec.Cmd, logPath string) (done chan struct{}, err error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	done = make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(done) }()
	return done, nil
}
