// Package filter keeps galactic's packet filter, behind the Filter
// interface: New is the kernel's, Off a no-op for the benchmark's
// reference build. The kernel's has three jobs: the nftables tables
// (tables.go, rules.go, write.go), the two tc programs and their maps
// (classifier.go, decap.go, C sources in bpf/), and the operations that
// keep them in step for an attachment or the whole node (node.go).
//
// The filter is the workload classifier, a tc eBPF program on the
// ingress of every workload host interface that looks the interface's
// attachment up in a map keyed by ifindex, and the nftables tables `inet
// galactic` and `arp galactic` (ARP passes no inet hook), whose chains and
// rules are fixed and whose sets hold what changes with the attachments on
// the node.
// ADD and DEL write and delete one map entry and set elements, never
// rules or programs, so the cost per packet is a few lookups whatever the
// number of attachments.
//
// What they enforce, for every workload host interface (a name with the
// tap or veth prefix; an interface without its entry or elements is
// closed, not open):
//   - the classifier: a packet is let through only when its source is in
//     the attachment's prefixes (its addresses and allowedSourcePrefixes),
//     or it is ICMPv6 from a link-local or the unspecified source (neighbour
//     discovery, DAD). Router advertisements, redirects and DHCP server
//     replies are dropped whatever their source; a veth's frames must carry
//     the container end's MAC. A neighbour advertisement's target must be
//     link-local or a source of the attachment; a veth's solicitations and
//     advertisements carry at most its own MAC as link-layer option.
//   - arp input: an ARP sender address must be a source of the attachment
//     (or 0.0.0.0), a veth's sender hardware address its MAC.
//   - input: from a workload the node accepts neighbour discovery, ICMP
//     echo requests to the interface's own gateways, and what answers its
//     own connections and pings (echo replies, TCP other than connection
//     requests); everything else addressed to the node (connection
//     requests and datagrams to any socket, broadcast, multicast,
//     link-local, ICMP errors) is dropped. From a VPC's VXLAN device only
//     echo requests and the same answers are accepted. No rule uses
//     connection tracking, so nothing forwarded is tracked.
//   - input: VXLAN (UDP 4789) is accepted only from a VTEP in the vtep sets,
//     which galactic-router keeps equal to the next hops it installed.
//
// Every operation runs in one netlink batch, which the kernel applies
// atomically (a GC pass's large change may take several). Attachment
// elements carry a timeout and are removed by expiring them, not deleted
// (write.go says why). Ensure rebuilds the table's rules when they are missing or
// not galactic's current ones (another agent flushed the ruleset), keeping
// the sets and their elements; it is safe to call from several processes
// at once, since each rebuild flushes the table's rules before adding them.
package filter
