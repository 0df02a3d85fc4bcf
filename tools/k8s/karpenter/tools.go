//go:build tools

// Package tools pins Karpenter's KWOK provider (sigs.k8s.io/karpenter/kwok), the real Karpenter the
// tests run beside nodekeeper (scripts/setup-k8s.sh builds it as karpenter-kwok).
package tools

import _ "sigs.k8s.io/karpenter/kwok"
