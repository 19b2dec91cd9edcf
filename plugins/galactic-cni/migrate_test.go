package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/settings"
	"github.com/galactic-cni/galactic/pkg/state"
)

func TestStandbyComesFromTheStanzaOrTheAnnotationAndNeedsHandoff(t *testing.T) {
	base := `{"cniVersion":"1.1.0","name":"n","type":"galactic-cni","vpc":"blue","attachment":"web-0"`
	for _, tc := range []struct {
		name, extra string
		want        bool
		code        uint
		say         string
	}{
		{"absent", ``, false, 0, ""},
		{"the stanza", `,"standby":true`, true, 0, ""},
		{"the annotation", `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"network.galactic.dev/standby":"true"}}`, true, 0, ""},
		{"the stanza wins", `,"standby":false,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"network.galactic.dev/standby":"true"}}`, false, 0, ""},
		{"an annotation that is no boolean", `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"network.galactic.dev/standby":"soon"}}`, false, types.ErrInvalidNetworkConfig, "network.galactic.dev/standby"},
		{"a JSON string", `,"standby":"true"`, false, types.ErrInvalidNetworkConfig, "standby must be true or false"},
		{"without handoff", `,"standby":true,"handoff":{"enabled":false}`, false, types.ErrInvalidNetworkConfig, "standby needs the handoff lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConf([]byte(base+tc.extra+"}"), required)
			if tc.code != 0 {
				if err == nil || err.Code != tc.code || !strings.Contains(err.Msg, tc.say) {
					t.Fatalf("got %v, want code %d saying %q", err, tc.code, tc.say)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Standby != tc.want {
				t.Fatalf("standby %v, want %v", c.Standby, tc.want)
			}
		})
	}
}

func TestOnlyTheNodeSubcommandsWithoutCNICommandRunAsCommands(t *testing.T) {
	none := func(string) string { return "" }
	for _, w := range []string{cmdAvailable, cmdUnavailable, cmdRelease, cmdPromote} {
		if !isCommand(none, []string{"galactic-cni", w}) {
			t.Errorf("%s is not a command", w)
		}
	}
	if isCommand(func(string) string { return "ADD" }, []string{"galactic-cni", cmdPromote}) {
		t.Error("promote ran under CNI_COMMAND=ADD")
	}
}

// TestReleaseAndPromoteRefuseWithTheirOwnExitCodeBeforeAnyAPICall covers
// what is decided on the node: the kubeconfig points nowhere, so reaching
// the API would exit with exitFailed.
func TestReleaseAndPromoteRefuseWithTheirOwnExitCodeBeforeAnyAPICall(t *testing.T) {
	dir := t.TempDir()
	store := state.NewStore(filepath.Join(dir, "state"))
	for _, r := range []state.Record{
		{ContainerID: "src", IfName: "net0", VPC: "blue", Attachment: "web-0", Holder: "node-a/src", HolderGeneration: 3},
		{ContainerID: "tgt", IfName: "net0", VPC: "blue", Attachment: "web-0", Standby: true, LeaseSeconds: 60},
		{ContainerID: "plain", IfName: "net0", VPC: "blue", Attachment: "nohandoff"},
		{ContainerID: "moved", IfName: "net0", VPC: "blue", Attachment: "web-0", Holder: "node-old/moved", HolderGeneration: 2},
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
	flags := func(att, container string, more ...string) []string {
		return append([]string{"--vpc", "blue", "--attachment", att, "--container", container}, more...)
	}
	for _, tc := range []struct {
		name, verb string
		args       []string
		want       int
		say        string
	}{
		{"release of a standby target", cmdRelease, flags("web-0", "tgt"), exitNotHolder, "to abort the migration, DEL it"},
		{"release without handoff", cmdRelease, flags("nohandoff", "plain"), exitNotHolder, "handoff is disabled"},
		{"release of a record of another node name", cmdRelease, flags("web-0", "moved"), exitNotHolder, "node-old/moved"},
		{"release of an unknown container", cmdRelease, flags("web-0", "none"), exitNoRecord, "no record"},
		{"promote without handoff", cmdPromote, flags("nohandoff", "plain"), exitNotHolder, "cannot be promoted"},
		{"promote with a wait out of range", cmdPromote, flags("web-0", "tgt", "--wait-seconds", "99999"), exitUsage, "--wait-seconds"},
		{"release does not take promote's flags", cmdRelease, flags("web-0", "src", "--available=false"), exitUsage, "available"},
		{"release with a reason", cmdRelease, flags("web-0", "src", "--reason", "Moving"), exitUsage, "--reason is promote's"},
		{"promote with a negative wait", cmdPromote, flags("web-0", "tgt", "--wait-seconds", "-2"), exitUsage, "--wait-seconds"},
		{"a release that needs the API", cmdRelease, flags("web-0", "src"), exitFailed, "kubeconfig"},
		{"a promote that needs the API", cmdPromote, flags("web-0", "tgt"), exitFailed, "kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := p.runCommand(tc.verb, tc.args, &stdout, &stderr); got != tc.want {
				t.Errorf("exit %d, want %d; stderr: %s", got, tc.want, stderr.String())
			}
			if stdout.Len() != 0 || !strings.Contains(stderr.String(), tc.say) {
				t.Errorf("stdout %q; stderr %q should say %q", stdout.String(), stderr.String(), tc.say)
			}
		})
	}
	// Nothing refused changed a record.
	for _, id := range []string{"src", "tgt"} {
		rec, _, _ := store.Get(id, "net0")
		if (id == "src" && rec.Holder != "node-a/src") || (id == "tgt" && !rec.Standby) {
			t.Errorf("record %s changed: %+v", id, rec)
		}
	}
}
