// Command tapholder acts like a VMM attaching to a tap: it opens
// /dev/net/tun, binds the fd to an existing tap with TUNSETIFF
// (IFF_TAP|IFF_NO_PI), prints "ready <name>" and holds the fd until it is
// killed. Run it inside the namespace of the tap (`ip netns exec`).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: tapholder <tap-name>")
		os.Exit(2)
	}
	name := os.Args[1]
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open /dev/net/tun:", err)
		os.Exit(1)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		fmt.Fprintf(os.Stderr, "TUNSETIFF %s: %v\n", name, err)
		os.Exit(1)
	}
	fmt.Println("ready", name)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	unix.Close(fd)
}
