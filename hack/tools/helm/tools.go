//go:build tools

// Package tools pins helm.sh/helm/v3 v3.22.0 for hack/helm.py.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
