#!/usr/bin/env bash
# scripts/deps.sh [--with-tests] - installs the Debian packages bfcshim needs
# when they are missing: meson and ninja (build), zlib (gzip traces),
# python3 (tests); with --with-tests also clang and its runtimes (libFuzzer)
# and chromium (the report is checked in headless Chromium), and from PyPI
# numba-cuda (Numba's driver layer is a test client: tests/e2e/test_numba.py
# and tests/python/test_numba_plugin.py, which skip without it), and real JAX
# and real TensorFlow, each in a virtual environment of its own kept between
# runs in ~/.cache/bfcshim (scripts/framework-venv.sh; tests/e2e/test_jax.py
# and test_tensorflow.py skip without them).
# Needs root for apt-get; otherwise it names what to install and fails.
set -u
want=(meson ninja-build pkg-config zlib1g-dev python3)
[ "${1:-}" = "--with-tests" ] && want+=(clang libclang-rt-14-dev chromium)

missing=()
for pkg in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$pkg")
done
# python3 may come from elsewhere (pyenv): accept any on PATH. The pip
# install test makes a virtual environment: Debian's Python needs python3-venv.
if command -v python3 >/dev/null 2>&1; then
    missing=("${missing[@]/python3}")
    [ "${1:-}" = "--with-tests" ] && ! python3 -c "import ensurepip" >/dev/null 2>&1 &&
        missing+=(python3-venv)
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))

# The version tested here (it drives the driver through cuda-bindings).
if [ "${1:-}" = "--with-tests" ] && ! python3 -c "import numba.cuda" >/dev/null 2>&1; then
    python3 -m pip install -q "numba-cuda==0.30.4" >/dev/null 2>&1 ||
        echo "bfcshim: could not install numba-cuda from PyPI: test_numba will skip" >&2
fi
# Numba's own test suite (test_numba_suite) imports these helpers.
if [ "${1:-}" = "--with-tests" ] && ! python3 -c "import pytest, filecheck" >/dev/null 2>&1; then
    python3 -m pip install -q "pytest==9.2.0" "filecheck==1.0.6" >/dev/null 2>&1 ||
        echo "bfcshim: could not install pytest and filecheck: test_numba_suite will skip" >&2
fi
# JAX needs Python >= 3.12 (this one may be older), TensorFlow <= 3.13:
# environments of their own, made once per machine; where one cannot be
# made, framework-venv.sh says why.
if [ "${1:-}" = "--with-tests" ]; then
    "$(dirname "$0")/framework-venv.sh" jax >/dev/null
    "$(dirname "$0")/framework-venv.sh" tensorflow >/dev/null
fi

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "bfcshim: missing packages: ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "bfcshim: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; } ||
    { echo "bfcshim: apt-get could not install ${missing[*]}" >&2; exit 1; }
