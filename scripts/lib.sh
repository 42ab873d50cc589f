# Shared by every script in scripts/: where things live, and how to install what is missing.
# Sourced, not run. Every step is idempotent: a second run on the same machine installs nothing.

set -euo pipefail

ACCEL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The Python environment (LibTorch lives inside its torch wheel) is cached outside the repository, keyed by
# the lock file, so a clean clone on the same machine reuses it and a change of pins builds a new one.
ACCEL_CACHE="${ACCEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/accel}"
ACCEL_LOCK="$ACCEL_ROOT/scripts/requirements.lock"
ACCEL_VENV="$ACCEL_CACHE/venv-$(sha256sum "$ACCEL_LOCK" | cut -c1-12)"
ACCEL_BUILD="${ACCEL_BUILD:-$ACCEL_ROOT/build}"

# Debian packages the build uses (headers and tools only; LibTorch comes from the lock file). libgloo-dev
# provides the gloo headers that LibTorch's ProcessGroupGloo.hpp includes (the torch wheel ships none).
ACCEL_APT_PACKAGES=(cmake g++ ninja-build ccache python3-venv librange-v3-dev libboost-dev catch2 libgloo-dev
                    libcli11-dev nlohmann-json3-dev libbenchmark-dev libssl-dev procps  # procps: pkill in tests
                    clang-format-14  # the layout check (tests/static/format.py)
                    doxygen)         # the API reference (scripts/docs, the docs.reference test)

log() { printf '\033[1m[accel]\033[0m %s\n' "$*" >&2; }

# install_apt [PACKAGE...]: the packages named (scripts/docs needs doxygen alone), or every one the build uses.
install_apt() {
  local missing=() wanted=("$@")
  [ ${#wanted[@]} -eq 0 ] && wanted=("${ACCEL_APT_PACKAGES[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_venv() {
  if [ -f "$ACCEL_VENV/.complete" ]; then return 0; fi
  log "creating $ACCEL_VENV (pinned torch, accelerate, conan; about 3 GB to download)"
  local t0=$SECONDS
  rm -rf "$ACCEL_VENV"
  python3 -m venv "$ACCEL_VENV"
  "$ACCEL_VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$ACCEL_LOCK"
  "$ACCEL_VENV/bin/python" -c 'import torch, accelerate' # the reference must import
  touch "$ACCEL_VENV/.complete"
  log "python environment ready in $((SECONDS - t0)) s"
}

# The tests' pinned Python extras (scripts/test-requirements.lock: TensorBoard's event reader) into the project
# environment; pip finds them installed on a second run and downloads nothing.
install_test_extras() {
  "$ACCEL_VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$ACCEL_ROOT/scripts/test-requirements.lock"
}

ensure_deps() {
  install_apt
  install_venv
  export PATH="$ACCEL_VENV/bin:$PATH"
  TORCH_PREFIX="$("$ACCEL_VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  export TORCH_PREFIX
}

configure() {
  ensure_deps
  if [ ! -f "$ACCEL_BUILD/CMakeCache.txt" ]; then
    local launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    cmake -S "$ACCEL_ROOT" -B "$ACCEL_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DACCEL_VENV="$ACCEL_VENV" "${launcher[@]}" \
      -DACCEL_BUILD_TESTS=ON -DACCEL_BUILD_TOOLS=ON -DACCEL_BUILD_EXAMPLES=ON -DACCEL_BUILD_BENCHMARKS=ON "$@"
  fi
}

# build [TARGET...]: everything, or only the targets named (the demo builds only what it runs).
build() {
  configure
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$ACCEL_BUILD" --parallel "${ACCEL_JOBS:-$(nproc)}" "${targets[@]}"
}
