//go:build tools

// Package tools pins github.com/kedacore/keda/v2 v2.21.0 for hack/cluster.py. KEDA's go.mod
// replaces some modules, which only its main module sees, so the wrapper repeats them.
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
