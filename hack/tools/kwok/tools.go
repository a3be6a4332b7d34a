//go:build tools

// Package tools pins sigs.k8s.io/kwok v0.8.0 for hack/cluster.py.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
