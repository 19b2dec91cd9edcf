// Package liveness decides whether a container still exists, from the node
// alone: an advertisement entry or a node record is live while its network
// namespace is.
package liveness

import (
	"golang.org/x/sys/unix"
)

// Netns reports whether path is a mounted network namespace. A path that is
// gone, or a leftover file whose namespace was unmounted, is not live.
func Netns(path string) bool {
	if path == "" {
		return false
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	// /proc/<pid>/ns/net lives on procfs (nsfs underneath); a bind mount from
	// `ip netns add` or a runtime's pinning shows as nsfs.
	return st.Type == unix.NSFS_MAGIC || st.Type == unix.PROC_SUPER_MAGIC
}
