//go:build tools

// Package tools pins Node Problem Detector, a peer the benchmarks run beside the agent
// (scripts/setup-peers.sh builds k8s.io/node-problem-detector/cmd/nodeproblemdetector).
package tools

import _ "k8s.io/node-problem-detector/cmd/nodeproblemdetector"
