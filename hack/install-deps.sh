#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo use when they are
# missing: `make test`, `make demo` and .ci/run all call it. Without root it
# only says what is missing (the tests that need it skip, saying why).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

need=()
# qemu and a static busybox run the VRF tests in a VM (test/integration/vrf)
# and the real guests on galactic taps (test/integration/vmm, the demo).
# FRR's bgpd is the route reflector of the routing tests and the demo;
# Debian's gobgpd is the graceful-restart helper peer for l2vpn-evpn; curl
# reads galactic-router's metrics inside a node namespace.
# nsenter starts containerd inside a node (test/integration/cri); runc is
# built with seccomp (the kubelet asks for it), so it needs gcc, pkg-config
# and libseccomp's headers. nft drops packets on the soak's fabric
# (`make soak`, test/integration/soak): netem is not in every kernel.
# clang-14 and llvm-14's llvm-strip compile pkg/filter's BPF programs for
# `make generate` and `make verify-generated`: the committed objects are
# those this exact compiler makes, so the versions are named, not "clang".
for pair in ip:iproute2 bridge:iproute2 make:make git:git gcc:gcc \
	qemu-system-x86_64:qemu-system-x86 busybox:busybox-static \
	/usr/lib/frr/bgpd:frr vtysh:frr gobgpd:gobgpd curl:curl \
	nsenter:util-linux pkg-config:pkg-config /usr/include/seccomp.h:libseccomp-dev \
	/usr/sbin/nft:nftables clang-14:clang-14 llvm-strip-14:llvm-14; do
	cmd=${pair%%:*}
	if [ -e "$cmd" ] || command -v "$cmd" >/dev/null 2>&1; then continue; fi
	need+=("${pair#*:}")
done
if [ "$(id -u)" != 0 ]; then
	[ ${#need[@]} -eq 0 ] || echo "install-deps: not root, not installing: ${need[*]}" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	[ ${#need[@]} -eq 0 ] || echo "install-deps: no apt-get; install by hand: ${need[*]}" >&2
	exit 0
fi
# The VM tests fetch the Debian kernel with `apt-get download`, which needs
# package lists even when nothing is to be installed.
if [ ${#need[@]} -gt 0 ] || ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
	apt-get update -q
fi
if [ ${#need[@]} -gt 0 ]; then
	apt-get install -y -q --no-install-recommends "${need[@]}"
fi
