#!/usr/bin/env bash
# Fails when generated files in ROOT are stale: the deepcopy code or CRDs
# of the API types (a type changed without `make generate`), or the BPF
# objects and loaders of pkg/filter (a C source changed, or the objects
# were not made by the clang-14 that hack/install-deps.sh installs). ROOT's
# generated files are regenerated in place so that the fix is ready to
# commit.
set -euo pipefail
root=${1:-.}
gen=${CONTROLLER_GEN:?set CONTROLLER_GEN to the controller-gen binary}
go=${GO:-go}
cd "$root"
api=(pkg/apis/network/v1alpha1/zz_generated.deepcopy.go installer/manifests/crds/*.yaml)
bpf=(pkg/filter/*_bpfel.go pkg/filter/*_bpfel.o pkg/filter/classifier_hash.go)
stale=()

before=$(cat "${api[@]}" 2>/dev/null | sha256sum)
"$gen" object paths=./pkg/apis/...
"$gen" crd paths=./pkg/apis/... output:crd:dir=installer/manifests/crds
api=(pkg/apis/network/v1alpha1/zz_generated.deepcopy.go installer/manifests/crds/*.yaml)
if [ "$before" != "$(cat "${api[@]}" | sha256sum)" ]; then
	echo "generated files were stale: the API types changed without 'make generate'." >&2
	stale+=("${api[@]}")
fi

# The objects are byte for byte what this compiler makes: without it
# nothing can be checked. CI installs it; elsewhere the check is skipped,
# saying so. A ROOT without the C sources (a copy of the API alone, as
# pkg/apis' own test makes) has no objects to check.
if [ ! -d pkg/filter/bpf ]; then
	:
elif ! command -v clang-14 >/dev/null || ! command -v llvm-strip-14 >/dev/null; then
	if [ -n "${CI:-}" ]; then
		echo "clang-14 and llvm-strip-14 are missing: run hack/install-deps.sh as root" >&2
		exit 1
	fi
	echo "not checking the BPF objects: clang-14 and llvm-strip-14 are missing (hack/install-deps.sh installs them)" >&2
else
	before=$(cat "${bpf[@]}" 2>/dev/null | sha256sum)
	"$go" generate ./pkg/filter/
	bpf=(pkg/filter/*_bpfel.go pkg/filter/*_bpfel.o pkg/filter/classifier_hash.go)
	if [ "$before" != "$(cat "${bpf[@]}" | sha256sum)" ]; then
		echo "generated files were stale: pkg/filter/bpf's C sources changed without 'make generate'." >&2
		stale+=("${bpf[@]}")
	fi
fi

if [ ${#stale[@]} -gt 0 ]; then
	echo "They have been regenerated now; review and commit: ${stale[*]}" >&2
	exit 1
fi
echo "generated files are up to date"
