//go:build tools

// Package tools pins the AWS Node Termination Handler, a peer the benchmarks run beside the agent
// (scripts/setup-peers.sh builds github.com/aws/aws-node-termination-handler/cmd).
package tools

import _ "github.com/aws/aws-node-termination-handler/cmd"
