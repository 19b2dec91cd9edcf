//go:build tools

// Package tools pins the container runtime the CRI tests run: containerd,
// its runc shim, ctr, runc and crictl. It is a module of its own so that
// its versions key their own cache, apart from the control plane's.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
