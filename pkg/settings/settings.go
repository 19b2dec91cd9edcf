// Package settings loads the node settings every galactic binary shares:
// the node config file first, then environment overrides, then defaults.
package settings

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
)

// Environment variables that override the node config file.
const (
	EnvConfig     = "GALACTIC_NODE_CONFIG"
	EnvNodeName   = "GALACTIC_NODE_NAME"
	EnvKubeconfig = "GALACTIC_KUBECONFIG"
	EnvNamespace  = "GALACTIC_NAMESPACE"
	EnvStateDir   = "GALACTIC_STATE_DIR"
	EnvLogFile    = "GALACTIC_LOG_FILE"
	// EnvRequireAttachmentObjects is "true" or "false".
	EnvRequireAttachmentObjects = "GALACTIC_REQUIRE_ATTACHMENT_OBJECTS"
)

// Defaults used when neither the file nor the environment sets a value.
const (
	DefaultConfig     = "/etc/galactic/node.json"
	DefaultKubeconfig = "/etc/galactic/kubeconfig"
	DefaultNamespace  = "galactic-system"
	DefaultStateDir   = "/var/lib/galactic"
	DefaultLogFile    = "/var/log/galactic/galactic.log"
)

// Node holds one node's settings; the JSON keys are the node config file's.
type Node struct {
	NodeName   string `json:"nodeName,omitempty"`
	Kubeconfig string `json:"kubeconfig,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
	StateDir   string `json:"stateDir,omitempty"`
	LogFile    string `json:"logFile,omitempty"`
	// RequireAttachmentObjects makes the plugins refuse inline attachments
	// (a stanza's vpc, addresses or vni): every attachment on the node is
	// a VPCAttachment.
	RequireAttachmentObjects bool `json:"requireAttachmentObjects,omitempty"`

	// Path is the config file the settings were read from.
	Path string `json:"-"`
}

// Load reads the node settings. getenv is os.Getenv outside tests. A missing
// config file is not an error (the environment may say everything); an
// unreadable or malformed one is. Load does not require a node name: callers
// that need one call RequireNodeName.
func Load(getenv func(string) string) (Node, error) {
	n := Node{Path: DefaultConfig}
	if p := getenv(EnvConfig); p != "" {
		n.Path = p
	}
	data, err := os.ReadFile(n.Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return Node{}, fmt.Errorf("cannot read node config %s: %w", n.Path, err)
	default:
		if err := json.Unmarshal(data, &n); err != nil {
			return Node{}, fmt.Errorf("node config %s is not valid JSON: %w", n.Path, err)
		}
	}
	for _, o := range []struct {
		field *string
		env   string
		def   string
	}{
		{&n.NodeName, EnvNodeName, ""},
		{&n.Kubeconfig, EnvKubeconfig, DefaultKubeconfig},
		{&n.Namespace, EnvNamespace, DefaultNamespace},
		{&n.StateDir, EnvStateDir, DefaultStateDir},
		{&n.LogFile, EnvLogFile, DefaultLogFile},
	} {
		if v := getenv(o.env); v != "" {
			*o.field = v
		}
		if *o.field == "" {
			*o.field = o.def
		}
	}
	if v := getenv(EnvRequireAttachmentObjects); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Node{}, fmt.Errorf("%s=%q is not a boolean: use true or false", EnvRequireAttachmentObjects, v)
		}
		n.RequireAttachmentObjects = b
	}
	return n, nil
}

// RequireNodeName returns an error that says where to set the node name
// when it is missing.
func (n Node) RequireNodeName() error {
	if n.NodeName != "" {
		return nil
	}
	return fmt.Errorf("node name is not set: set \"nodeName\" in %s or the %s environment variable", n.Path, EnvNodeName)
}
