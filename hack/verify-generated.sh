#!/usr/bin/env bash
# Fails when the generated deepcopy code or CRD of the API types in ROOT is
# stale, i.e. a type changed without `make generate`. ROOT's generated files
# are regenerated in place so that the fix is ready to commit.
set -euo pipefail
root=${1:-.}
gen=${CONTROLLER_GEN:?set CONTROLLER_GEN to the controller-gen binary}
cd "$root"
files=(pkg/apis/network/v1alpha1/zz_generated.deepcopy.go installer/manifests/crds/*.yaml)
before=$(cat "${files[@]}" 2>/dev/null | sha256sum)
"$gen" object paths=./pkg/apis/...
"$gen" crd paths=./pkg/apis/... output:crd:dir=installer/manifests/crds
files=(pkg/apis/network/v1alpha1/zz_generated.deepcopy.go installer/manifests/crds/*.yaml)
after=$(cat "${files[@]}" | sha256sum)
if [ "$before" != "$after" ]; then
	echo "generated files were stale: the API types changed without 'make generate'." >&2
	echo "They have been regenerated now; review and commit: ${files[*]}" >&2
	exit 1
fi
echo "generated files are up to date"
