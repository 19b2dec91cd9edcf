// Package bench is `make bench`: it measures what galactic's ADD, DEL and
// GC pass cost on this machine, each next to a reference measured in the
// same run, and renders docs/benchmarks.md.
//
// Everything runs against real components, as the integration tests do: a
// real kube-apiserver and etcd (test/harness), network namespaces as nodes
// and containers, the built plugins run by the real cnitool. API requests
// are counted by a TLS-terminating proxy (Proxy) that the nodes'
// kubeconfig points at; timings never go through it. The Routing section
// adds FRR's bgpd as route reflector and Debian's gobgpd as its reference.
package bench
