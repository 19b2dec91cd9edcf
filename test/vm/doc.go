// Package vm boots a real Debian kernel under qemu (KVM) to run tests that
// need kernel features the test machine lacks, such as VRF.
//
// EnsureKernel fetches the kernel package with `apt-get download` once and
// keeps the kernel image and the requested modules (with the modules they
// depend on) in the cache. An Image is an initramfs of busybox, those
// modules and static Go binaries, whose /init loads the modules, runs one
// command and powers off. Boot runs qemu without a network device under a
// hard timeout and reads the command's exit status from the serial console,
// where /init prints it between markers.
package vm
