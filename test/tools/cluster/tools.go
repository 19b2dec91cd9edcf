//go:build tools

// Package tools pins what the harness's multi-node cluster adds to the
// control plane: kube-controller-manager, kube-scheduler and kubectl (its
// kustomize applies the shipped manifests). It is a module of its own so
// that its versions key their own cache, apart from the control plane's
// and the container runtime's; the replace block pins the k8s.io staging
// modules to the same release as kube-apiserver and the kubelet.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
