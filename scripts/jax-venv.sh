#!/usr/bin/env bash
# scripts/jax-venv.sh [--find] - the virtual environment with real JAX that
# tests/e2e/test_jax.py runs on the fake driver: jax, jaxlib,
# jax-cuda13-plugin and jax-cuda13-pjrt at JAX_VERSION, without the nvidia-*
# wheels (put/get/delete/copies need none of them: docs/frameworks.md).
#
# Made once per machine and kept between CI runs in
# ${XDG_CACHE_HOME:-~/.cache}/bfcshim/jax-VERSION (BFCSHIM_JAX_VENV overrides),
# so a warm run only checks the stamp. The stamp is written last: an install
# cut short is made again, never trusted.
#
# JAX 0.11 needs Python >= 3.12: pyenv's 3.12 if pyenv has one, else a
# python3.12 on PATH, else one that uv installs (uv from PATH, or from PyPI
# into the cache; its Python is kept in the cache too); none of them: the
# reason is printed and the script exits 0 (the test then skips visibly).
#
#   (no option)  make the environment if missing; print its path last
#   --find       print its path if it is complete, else exit 1 (no install)
set -u
JAX_VERSION=0.11.2
cache=${XDG_CACHE_HOME:-$HOME/.cache}/bfcshim
venv=${BFCSHIM_JAX_VENV:-$cache/jax-$JAX_VERSION}
stamp=$venv/.bfcshim-jax-$JAX_VERSION

if [ -f "$stamp" ] && "$venv/bin/python" -c "import jax" >/dev/null 2>&1; then
    echo "$venv"
    exit 0
fi
[ "${1:-}" = "--find" ] && exit 1

say() { echo "bfcshim: $*: test_jax will skip" >&2; }

# A Python >= 3.12 to make the environment with.
py=
if command -v pyenv >/dev/null 2>&1; then
    v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9](\.[0-9]+)?$' | sort -V | head -1)
    [ -n "$v" ] && py=$(pyenv root)/versions/$v/bin/python3
fi
if [ -z "$py" ]; then
    for c in python3.12 python3.13 python3; do
        if command -v "$c" >/dev/null 2>&1 &&
            "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            py=$(command -v "$c"); break
        fi
    done
fi
uv=
if [ -z "$py" ]; then
    uv=$(command -v uv 2>/dev/null)
    [ -z "$uv" ] && [ -x "$cache/uv/bin/uv" ] && uv=$cache/uv/bin/uv
    if [ -z "$uv" ] && python3 -m pip install -q --disable-pip-version-check \
            --target "$cache/uv" uv >/dev/null 2>&1; then
        uv=$cache/uv/bin/uv
    fi
    if [ -z "$uv" ] || [ ! -x "$uv" ]; then
        say "no Python >= 3.12 (pyenv, PATH) and no uv to install one"
        exit 0
    fi
fi

started=$SECONDS
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if [ -n "$uv" ]; then
    UV_PYTHON_INSTALL_DIR=$cache/uv-python "$uv" venv -q --seed --python 3.12 "$venv" \
            >"$venv.log" 2>&1 ||
        { say "uv could not make a Python 3.12 environment (see $venv.log)"; exit 0; }
else
    "$py" -m venv "$venv" >/dev/null 2>&1 ||
        { say "$py -m venv failed"; exit 0; }
fi
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" \
        "jax-cuda13-plugin==$JAX_VERSION" "jax-cuda13-pjrt==$JAX_VERSION" >"$venv.log" 2>&1; then
    say "could not install JAX $JAX_VERSION from PyPI (see $venv.log)"
    rm -rf "$venv"
    exit 0
fi
touch "$stamp"
echo "bfcshim: JAX $JAX_VERSION installed in $venv ($((SECONDS - started)) s)" >&2
echo "$venv"
