//go:build tools

// Package tools pins go.etcd.io/etcd/server/v3 v3.6.16 for hack/cluster.py.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
