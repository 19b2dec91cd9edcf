//go:build tools

// Package tools pins the container runtime the CRI tests run: containerd,
// its runc shim, ctr, runc, crictl and the kubelet. It is a module of its
// own so that its versions key their own cache, apart from the control
// plane's; the replace block pins the k8s.io staging modules to the
// kubelet's release, as test/tools does for kube-apiserver.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
