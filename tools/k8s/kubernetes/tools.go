//go:build tools

// Package tools pins the Kubernetes commands (control plane, and the real node's kubelet and kube-proxy) nodekeeper's tests run.
// Nothing here is compiled into nodekeeper; scripts/setup-k8s.sh builds these commands.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
