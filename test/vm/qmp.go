package vm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// QMP is a client of qemu's machine protocol on a unix socket: one command
// at a time, events skipped.
type QMP struct {
	conn net.Conn
	r    *bufio.Reader
}

// DialQMP connects to qemu's QMP socket at path, retrying until timeout
// while qemu starts, and negotiates capabilities.
func DialQMP(path string, timeout time.Duration) (*QMP, error) {
	deadline := time.Now().Add(timeout)
	var conn net.Conn
	var err error
	for {
		if conn, err = net.Dial("unix", path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connecting to QMP at %s: %w", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	q := &QMP{conn: conn, r: bufio.NewReader(conn)}
	// The greeting, then capabilities negotiation leaves command mode on.
	if _, err := q.r.ReadBytes('\n'); err != nil {
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	if _, err := q.Execute("qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// Execute runs one command and returns its "return" value.
func (q *QMP) Execute(command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	_ = q.conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", command, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("QMP %s: %w", command, err)
		}
		var resp struct {
			Event  string          `json:"event"`
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class, Desc string
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("QMP %s: %q: %w", command, strings.TrimSpace(string(line)), err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, fmt.Errorf("QMP %s: %s: %s", command, resp.Error.Class, resp.Error.Desc)
		}
		return resp.Return, nil
	}
}

// Close closes the connection; qemu keeps running.
func (q *QMP) Close() error { return q.conn.Close() }

// MigrationStatus is what query-migrate says of an outgoing migration.
type MigrationStatus struct {
	Status string `json:"status"`
	// Downtime is qemu's measure of the guest's pause, in milliseconds,
	// once completed; TotalTime the whole migration's.
	Downtime  int64  `json:"downtime"`
	TotalTime int64  `json:"total-time"`
	ErrorDesc string `json:"error-desc"`
}

// Migrate sends the guest to uri (such as "tcp:192.0.2.12:4444"), where a
// qemu started with -incoming waits, and returns once it completed: the
// guest is paused here for good and its whole state is on the target.
func (q *QMP) Migrate(uri string, timeout time.Duration) (MigrationStatus, error) {
	// An idle test guest dirties little: let the last copy use the link.
	if _, err := q.Execute("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 30}); err != nil {
		return MigrationStatus{}, err
	}
	if _, err := q.Execute("migrate", map[string]any{"uri": uri}); err != nil {
		return MigrationStatus{}, err
	}
	deadline := time.Now().Add(timeout)
	for {
		raw, err := q.Execute("query-migrate", nil)
		if err != nil {
			return MigrationStatus{}, err
		}
		var st MigrationStatus
		if err := json.Unmarshal(raw, &st); err != nil {
			return st, fmt.Errorf("query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return st, nil
		case "failed", "cancelled":
			return st, fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		if time.Now().After(deadline) {
			_, _ = q.Execute("migrate_cancel", nil)
			return st, errors.New("migration did not complete within " + timeout.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Status is the VM's run state ("running", "paused", "inmigrate",
// "postmigrate", ...).
func (q *QMP) Status() (string, error) {
	raw, err := q.Execute("query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	return st.Status, json.Unmarshal(raw, &st)
}
