package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/router/config"
)

func TestTheCommandLineRejectsWhatItDoesNotKnow(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: galactic-installer <command>"},
		{[]string{"reinstall"}, 2, `unknown command "reinstall"`},
		{[]string{"install", "extra"}, 2, "unexpected arguments"},
		{[]string{"uninstall", "--interval", "1s"}, 2, "flag provided but not defined: -interval"},
		{[]string{"help"}, 0, ""},
		{[]string{"install", "--router-asn", "sixty-five"}, 2, `invalid value "sixty-five" for flag -router-asn: not a whole number`},
		{[]string{"install", "--router-peer", "192.0.2.1"}, 2, "is not ADDRESS:ASN[:PORT]"},
		{[]string{"uninstall", "--router-asn", "65010"}, 2, "flag provided but not defined: -router-asn"},
		{[]string{"run", "--router-config", "/x"}, 2, "flag provided but not defined: -router-config"},
	} {
		var out, errs bytes.Buffer
		code := run(context.Background(), tc.args, func(string) string { return "" }, &out, &errs)
		if code != tc.code || !strings.Contains(errs.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errs.String(), tc.code, tc.want)
		}
	}
}

func TestInstallFailsWithTheReasonOnStderrAndExitCodeOne(t *testing.T) {
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"install", "--root", t.TempDir(), "--source-dir", t.TempDir()}, func(string) string { return "" }, &out, &errs)
	if code != 1 || !strings.Contains(errs.String(), "galactic-installer install: node name is not set") {
		t.Errorf("exit %d, stderr %q", code, errs.String())
	}
}

func TestRouterFlagsReachTheRouterConfig(t *testing.T) {
	root, src := t.TempDir(), t.TempDir()
	for _, b := range []string{"galactic-cni", "galactic-bgp"} {
		if err := os.WriteFile(filepath.Join(src, b), []byte("plugin"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"install", "--root", root, "--source-dir", src, "--node-name", "node-a", "--kubeconfig", writeKubeconfig(t),
		"--router-asn", "65010", "--router-underlay", "192.0.2.11", "--router-id", "192.0.2.111",
		"--router-peer", "192.0.2.1:65000", "--router-peer", "[fd00::1]:65000:1179",
		"--router-route-target-asn", "65000", "--router-listen-port", "-1", "--router-withdraw-hold-seconds", "5",
		"--router-graceful-restart-seconds", "60", "--router-metrics-address", "127.0.0.1:19655"}
	var out, errs bytes.Buffer
	if code := run(context.Background(), args, func(string) string { return "" }, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	c, err := config.Load(filepath.Join(root, "etc/galactic/router.json"))
	if err != nil {
		t.Fatal(err)
	}
	if c.ASN != 65010 || c.Underlay.String() != "192.0.2.11" || c.RouterID.String() != "192.0.2.111" || len(c.Peers) != 2 ||
		c.Peers[1].Address.String() != "fd00::1" || c.Peers[1].Port != 1179 || c.RouteTargetASN != 65000 || c.ListenPort != -1 ||
		c.WithdrawHold != 5*time.Second || c.RestartTime != time.Minute || c.MetricsAddress != "127.0.0.1:19655" {
		t.Errorf("router config from flags: %+v", c)
	}
}

// writeKubeconfig is a minimal kubeconfig, so install needs no service account.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	data := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:6443\"}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
