//go:build tools

// Package tools pins the binaries the test harness and code generation build:
// kube-apiserver and etcd for the real control plane, controller-gen for the API.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
