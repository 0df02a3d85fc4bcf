//go:build tools

// Package tools pins crictl, the CRI client the real-CRI-O tests pull images with
// (scripts/setup-crio.sh builds sigs.k8s.io/cri-tools/cmd/crictl from this module).
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
