//go:build tools

// Package tools pins CRI-O, the container runtime the agent configures: the real-CRI-O tests run it under
// systemd in nspawn (scripts/setup-crio.sh builds github.com/cri-o/cri-o/cmd/crio and pinns from this module).
package tools

import _ "github.com/cri-o/cri-o/cmd/crio"
