//go:build tools

// Package tools pins the KWOK controller that plays kubelet for nodekeeper's test nodes.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
