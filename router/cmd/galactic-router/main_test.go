package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestABadConfigStopsTheRouterWithAMessageNamingTheKey(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ config, key string }{
		{`{"asn":0,"underlay":"192.0.2.11","peers":[{"address":"192.0.2.1","asn":65000}]}`, "asn"},
		{`{"asn":65000,"underlay":"node-a","peers":[{"address":"192.0.2.1","asn":65000}]}`, "underlay"},
		{`{"asn":65000,"underlay":"192.0.2.11","peers":[{"address":"192.0.2.1"}]}`, "peers[0].asn"},
		{`{"asn":65000,"underlay":"192.0.2.11","peers":[{"address":"192.0.2.1","asn":65000,"holdSeconds":2}]}`, "peers[0].holdSeconds"},
		{`{"asn":65000,"underlay":"192.0.2.11","peers":[{"address":"192.0.2.1","asn":65000,"holdSeconds":9,"keepaliveSeconds":9}]}`, "peers[0].keepaliveSeconds"},
		{`{"asn":65000,"underlay":"192.0.2.11","color":"blue","peers":[{"address":"192.0.2.1","asn":65000}]}`, "color"},
	} {
		path := filepath.Join(dir, "router.json")
		if err := os.WriteFile(path, []byte(tc.config), 0o644); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"GALACTIC_NODE_NAME": "node-a", "GALACTIC_NODE_CONFIG": filepath.Join(dir, "absent.json")}
		err := run([]string{"run", "--config", path}, func(k string) string { return env[k] }, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.key+":") {
			t.Errorf("config %s: got %v, want an error naming %s", tc.config, err, tc.key)
		}
	}
}

func TestAnUnknownCommandIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "router.json")
	if err := os.WriteFile(path, []byte(`{"asn":65000,"underlay":"192.0.2.11","peers":[{"address":"192.0.2.1","asn":65000}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GALACTIC_NODE_NAME": "node-a", "GALACTIC_NODE_CONFIG": filepath.Join(dir, "absent.json")}
	if err := run([]string{"fly", "--config", path}, func(k string) string { return env[k] }, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `unknown command "fly"`) {
		t.Fatalf("got %v", err)
	}
}

func TestAReflectorConfigRefusesDrainAndNeedsNoNodeSettings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "router.json")
	if err := os.WriteFile(path, []byte(`{"role":"reflector","asn":65000,"routerID":"192.0.2.3","clientRanges":["192.0.2.0/24"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// No node name and an unreadable node config: a reflector reads neither.
	env := map[string]string{"GALACTIC_NODE_CONFIG": dir}
	err := run([]string{"drain", "--config", path}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `not a command of role "reflector"`) {
		t.Fatalf("drain on a reflector: %v", err)
	}
}
