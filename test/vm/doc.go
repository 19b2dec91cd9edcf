// Package vm boots a real Debian kernel under qemu (KVM where it can, TCG
// otherwise) to run tests that need kernel features the test machine
// lacks, such as VRF, and to run real guests on galactic taps.
//
// EnsureKernel fetches the kernel package with `apt-get download` once and
// keeps the kernel image and the requested modules (with the modules they
// depend on) in the cache. An Image is an initramfs of busybox, those
// modules and static Go binaries, whose /init loads the modules, runs one
// command and powers off. Boot runs qemu without a network device under a
// hard timeout and reads the command's exit status from the serial console,
// where /init prints it between markers.
//
// A Guest is the other use: qemu started inside a node's network namespace
// on an existing (galactic) tap with a virtio-net NIC, booting an image
// whose init takes its addresses and gateways from the kernel command
// line, answers ping, runs an echo service and says ready on the console.
// It stays up until it is told to power off from the console or killed.
package vm
