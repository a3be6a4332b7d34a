//go:build tools

// Package tools pins github.com/seaweedfs/seaweedfs v0.0.0-20261109003541-7506e5f91cd6 for hack/cluster.py.
// SeaweedFS's go.mod replaces some modules, which only its main module sees, so the wrapper repeats them.
package tools

import (
	_ "github.com/seaweedfs/seaweedfs/weed"
)
