package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

func TestOnlyAnAvailabilityWordWithoutCNICommandRunsTheReport(t *testing.T) {
	env := func(cmd string) func(string) string {
		return func(k string) string {
			if k == "CNI_COMMAND" {
				return cmd
			}
			return ""
		}
	}
	for _, tc := range []struct {
		cmd  string
		args []string
		want bool
	}{
		{"", []string{"galactic-cni", "available"}, true},
		{"", []string{"galactic-cni", "unavailable", "--vpc", "blue"}, true},
		{"ADD", []string{"galactic-cni", "available"}, false},
		{"", []string{"galactic-cni"}, false},
		{"", []string{"galactic-cni", "version"}, false},
	} {
		if got := isCommand(env(tc.cmd), tc.args); got != tc.want {
			t.Errorf("CNI_COMMAND=%q %v: got %v, want %v", tc.cmd, tc.args, got, tc.want)
		}
	}
}

// TestTheReportRefusesWithItsOwnExitCodeBeforeAnyAPICall covers the
// outcomes decided on the node; the kubeconfig points nowhere, so reaching
// the API would fail the test with exitFailed.
func TestTheReportRefusesWithItsOwnExitCodeBeforeAnyAPICall(t *testing.T) {
	dir := t.TempDir()
	store := state.NewStore(filepath.Join(dir, "state"))
	for _, r := range []state.Record{
		{ContainerID: "c1", IfName: "net0", VPC: "blue", Attachment: "web-0-net0", Holder: "node-a/c1", HolderGeneration: 3},
		{ContainerID: "c2", IfName: "net0", VPC: "blue", Attachment: "nohandoff"},
		{ContainerID: "c3", IfName: "net0", VPC: "blue", Attachment: "twice", Holder: "node-a/c3", HolderGeneration: 1},
		{ContainerID: "c3", IfName: "net1", VPC: "blue", Attachment: "twice", Holder: "node-a/c3", HolderGeneration: 1},
		{ContainerID: "c4", IfName: "net0", VPC: "blue", Attachment: "renamed", Holder: "node-old/c4", HolderGeneration: 1},
		{ContainerID: "c5", IfName: "eth0", VPC: "blue-1a2b3c4d", Attachment: "web-5e6f7a8b", Namespace: "tenant-a", AttachmentName: "web", AttachmentUID: "u1", Holder: "node-a/c5", HolderGeneration: 2},
		{ContainerID: "c5", IfName: "net1", ChainIfName: "eth0", VPC: "blue-1a2b3c4d", Attachment: "db-00000000", Namespace: "tenant-a", AttachmentName: "db", AttachmentUID: "u2"},
	} {
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	vars := map[string]string{
		settings.EnvConfig:     filepath.Join(dir, "none.json"),
		settings.EnvNodeName:   "node-a",
		settings.EnvStateDir:   filepath.Join(dir, "state"),
		settings.EnvLogFile:    filepath.Join(dir, "galactic.log"),
		settings.EnvKubeconfig: filepath.Join(dir, "no-kubeconfig"),
	}
	p := &plugin{getenv: func(k string) string { return vars[k] }}
	for _, tc := range []struct {
		name string
		args []string
		want int
		say  string
	}{
		{"an unknown flag", []string{"--vpc", "blue", "--bogus"}, exitUsage, "bogus"},
		{"no container", []string{"--vpc", "blue", "--attachment", "web-0-net0"}, exitUsage, "--container"},
		{"an invalid VPC", []string{"--vpc", "Blue", "--attachment", "web-0-net0", "--container", "c1"}, exitUsage, "DNS-1123"},
		{"a reason a condition cannot carry", []string{"--vpc", "blue", "--attachment", "web-0-net0", "--container", "c1", "--reason", "shutting down"}, exitUsage, "condition reason"},
		{"an unknown attachment", []string{"--vpc", "blue", "--attachment", "other", "--container", "c1"}, exitNoRecord, "no record"},
		{"an unknown container", []string{"--vpc", "blue", "--attachment", "web-0-net0", "--container", "c9"}, exitNoRecord, "no record"},
		{"another interface", []string{"--vpc", "blue", "--attachment", "web-0-net0", "--container", "c1", "--ifname", "net1"}, exitNoRecord, "no record"},
		{"a container without handoff", []string{"--vpc", "blue", "--attachment", "nohandoff", "--container", "c2"}, exitNotHolder, "handoff is disabled"},
		{"a record of another node name", []string{"--vpc", "blue", "--attachment", "renamed", "--container", "c4"}, exitNotHolder, "node-old/c4"},
		{"an attachment on two interfaces without --ifname", []string{"--vpc", "blue", "--attachment", "twice", "--container", "c3"}, exitUsage, "--ifname"},
		{"a holder, but no API server", []string{"--vpc", "blue", "--attachment", "web-0-net0", "--container", "c1"}, exitFailed, "kubeconfig"},
		{"neither namespace nor vpc", []string{"--attachment", "web", "--container", "c5"}, exitUsage, "--namespace (a VPCAttachment's) or --vpc"},
		{"both namespace and vpc", []string{"--namespace", "tenant-a", "--vpc", "blue", "--attachment", "web", "--container", "c5"}, exitUsage, "both set"},
		{"an invalid namespace", []string{"--namespace", "Tenant", "--attachment", "web", "--container", "c5"}, exitUsage, "DNS-1123"},
		{"a VPCAttachment of another namespace", []string{"--namespace", "tenant-b", "--attachment", "web", "--container", "c5"}, exitNoRecord, "VPCAttachment tenant-b/web"},
		{"a VPCAttachment by its data-plane names", []string{"--vpc", "blue-1a2b3c4d", "--attachment", "web-5e6f7a8b", "--container", "c5"}, exitNoRecord, "no record"},
		{"an inline attachment by namespace", []string{"--namespace", "tenant-a", "--attachment", "web-0-net0", "--container", "c1"}, exitNoRecord, "no record"},
		{"a VPCAttachment without handoff", []string{"--namespace", "tenant-a", "--attachment", "db", "--container", "c5"}, exitNotHolder, "VPCAttachment tenant-a/db"},
		{"a VPCAttachment's holder, but no API server", []string{"--namespace", "tenant-a", "--attachment", "web", "--container", "c5"}, exitFailed, "kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := p.report(cmdAvailable, tc.args, &stdout, &stderr); got != tc.want {
				t.Errorf("exit %d, want %d; stderr: %s", got, tc.want, stderr.String())
			}
			if stdout.Len() != 0 || !strings.Contains(stderr.String(), tc.say) {
				t.Errorf("stdout %q; stderr %q should say %q", stdout.String(), stderr.String(), tc.say)
			}
		})
	}
}
