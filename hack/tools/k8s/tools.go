//go:build tools

// Package tools pins the Kubernetes commands built by hack/cluster.py. k8s.io/kubernetes
// requires its staging modules at v0.0.0, so each one is replaced by its
// published version (list generated from the release's own go.mod).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
