// CoreDNS v1.14.6 with the plugins of Kubernetes' own add-on Corefile only (cluster/addons/dns/coredns in
// k8s.io/kubernetes): the real node's cluster DNS (scripts/k8s-node.sh). CoreDNS documents this way of
// building it with a chosen plugin set: import the plugins, then run coremain; the directive order stays
// CoreDNS's own (core/dnsserver's generated list).
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
