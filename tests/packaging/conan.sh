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
# The with_cuda=False package of a consumer configured CPU only (-DACCEL_CPU_ONLY=ON, README "CPU only"), after the
# package was last created with with_cuda=True (one package serves both): no LibTorch CUDA search, no warning from it.
log="$build/packaging/conan-cpu-only.log"
"$conan" test "$test_folder" accel/0.1.0 -pr:a "$src/conan/profiles/system" -o "accel/*:with_cuda=False" -nr \
         -c "tools.cmake.cmaketoolchain:extra_variables={'ACCEL_CPU_ONLY': 'ON'}" >"$log" 2>&1 || { cat "$log"; exit 1; }
if grep -E "CUDA_ARCHITECTURES|kineto not found|PyTorch: CUDA" "$log"; then
  echo "ACCEL_CPU_ONLY=ON through Conan: LibTorch's CUDA search at configure time (above)" >&2
  exit 1
fi
grep -q "ACCEL_WITH_CUDA=OFF; ACCEL_CPU_ONLY=ON" "$log"
grep "accel test_package:" "$log"
grep -q "ACCEL_WITH_CUDA=0" "$log"
# The package's accel_target_precompile_headers (test_package/CMakeLists.txt) precompiled the header for the program.
grep -q "cmake_pch.hxx.gch" "$log"
