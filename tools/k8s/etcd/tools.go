//go:build tools

// Package tools pins the etcd server nodekeeper's test control plane runs.
package tools

import _ "go.etcd.io/etcd/server/v3"
