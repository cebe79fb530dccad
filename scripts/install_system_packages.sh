#!/usr/bin/env bash
# Debian/Ubuntu packages the test suite uses: OpenBLAS (MLX's CPU backend on a fast BLAS) and Xvfb
# (the menubar's Tk menu on a virtual display). Installs what is missing when run as root with
# apt-get; elsewhere (macOS, no root) says what to install and goes on.
set -euo pipefail
[ "$(uname -s)" = Linux ] || exit 0
missing=()
[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 ] \
  || [ -e /usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0 ] \
  || missing+=(libopenblas0-pthread)
command -v Xvfb >/dev/null || missing+=(xvfb)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "optional system packages missing: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
fi
