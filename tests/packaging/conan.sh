#!/usr/bin/env bash
# `conan create` of the header-library recipe, offline: the profile kept in the repository maps the
# requirements ConanCenter would provide onto the system's packages. Runs test_package (with and without
# the with_cuda option), which builds and runs a program linking LibTorch.
#   conan.sh SOURCE_DIR BUILD_DIR CONAN TORCH_PREFIX
set -euo pipefail
src=$1 build=$2 conan=$3
export TORCH_PREFIX=$4
export CONAN_HOME="$build/packaging/conan-home"
mkdir -p "$CONAN_HOME"
"$conan" remote remove conancenter >/dev/null 2>&1 || true   # no remote is needed, and none is reachable
test_folder="$build/packaging/conan-test-package"
rm -rf "$test_folder" && cp -r "$src/test_package" "$test_folder"
for cuda in False True; do
  "$conan" create "$src" -pr:a "$src/conan/profiles/system" -o "accel/*:with_cuda=$cuda" -tf "$test_folder" \
           --build=missing -nr
done
