#!/usr/bin/env bash
# Debian/Ubuntu packages the test suite uses: OpenBLAS (MLX's CPU backend on a fast BLAS), Xvfb and
# Tk (the menubar's Tk menu on a virtual display). Installs what is missing when run as root with
# apt-get; elsewhere (macOS, no root) says what to install and goes on. `blas`: OpenBLAS alone
# (what serving needs; `make serve`'s install).
# PYTHON: the interpreter the venv is made from (the Makefile's default, python3).
set -euo pipefail
[ "$(uname -s)" = Linux ] || exit 0
missing=()
[ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 ] \
  || [ -e /usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0 ] \
  || missing+=(libopenblas0-pthread)
if [ "${1:-}" != blas ]; then
  command -v Xvfb >/dev/null || missing+=(xvfb)
  # Debian's own Python has Tk in python3-tk; one built from source (pyenv) links libtk8.6.
  python=${PYTHON:-python3}
  if command -v "$python" >/dev/null && ! tk_error=$("$python" -c 'import tkinter' 2>&1); then
    case "$tk_error" in
      *libtk*|*libtcl*) missing+=(libtk8.6) ;;
      *) missing+=(python3-tk) ;;
    esac
  fi
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "optional system packages missing: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
fi
