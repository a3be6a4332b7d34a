//go:build tools

// Package tools pins k8s.io/kube-state-metrics/v2 v2.20.0 for hack/cluster.py.
package tools

import (
	_ "k8s.io/kube-state-metrics/v2"
)
