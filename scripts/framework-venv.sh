#!/usr/bin/env bash
# scripts/framework-venv.sh FRAMEWORK [--find] - the virtual environment with
# a real framework that the tests run on the fake driver:
#
#   jax         jax, jaxlib, jax-cuda13-plugin, jax-cuda13-pjrt 0.11.2
#               (tests/e2e/test_jax.py); Python 3.12 to 3.14
#   tensorflow  tensorflow 2.21.0 (tests/e2e/test_tensorflow.py); Python
#               3.10 to 3.13
#
# without the nvidia-* wheels (round trips, deletes and copies need none of
# them: docs/frameworks.md says what stands in for them).
#
# Made once per machine and kept between CI runs in
# ${XDG_CACHE_HOME:-~/.cache}/bfcshim/FRAMEWORK-VERSION, so a warm run only
# checks the stamp. BFCSHIM_JAX_VENV / BFCSHIM_TENSORFLOW_VENV name an
# environment of the user's instead: used when the framework imports there,
# never made or deleted by this script.
# The stamp is written last: an install cut short is made again, never
# trusted.
#
# The Python: pyenv's newest in range if pyenv has one, else python3.N or
# python3 on PATH in range, else one that uv installs (uv from PATH, or from
# PyPI into the cache; its Python is kept in the cache too); none of them:
# the reason is printed and the script exits 0 (the test then skips
# visibly).
#
#   (no option)  make the environment if missing; print its path last
#   --find       print its path if it is complete, else exit 1 (no install)
set -u
framework=${1:-}
case $framework in
    jax)
        version=0.11.2 module=jax lo=12 hi=14 override=${BFCSHIM_JAX_VENV:-}
        packages=("jax==$version" "jaxlib==$version" "jax-cuda13-plugin==$version"
                  "jax-cuda13-pjrt==$version") ;;
    tensorflow)
        version=2.21.0 module=tensorflow lo=10 hi=13 override=${BFCSHIM_TENSORFLOW_VENV:-}
        packages=("tensorflow==$version") ;;
    *)
        echo "usage: $0 jax|tensorflow [--find]" >&2
        exit 2 ;;
esac
cache=${XDG_CACHE_HOME:-$HOME/.cache}/bfcshim
venv=${override:-$cache/$framework-$version}
stamp=$venv/.bfcshim-$framework-$version

if [ -f "$stamp" ] && "$venv/bin/python" -c "import $module" >/dev/null 2>&1; then
    echo "$venv"
    exit 0
fi
# An environment the user named is theirs: used if the framework imports
# there, never made again (that would delete it first).
if [ -n "$override" ]; then
    if "$venv/bin/python" -c "import $module" >/dev/null 2>&1; then
        echo "$venv"
        exit 0
    fi
    [ "${2:-}" = "--find" ] && exit 1
    echo "bfcshim: $venv (from BFCSHIM_${framework^^}_VENV) has no importable $module:" \
         "the $framework test will skip" >&2
    exit 0
fi
[ "${2:-}" = "--find" ] && exit 1

say() { echo "bfcshim: $*: the $framework test will skip" >&2; }
in_range() {
    "$1" -c "import sys; sys.exit(not ((3, $lo) <= sys.version_info[:2] <= (3, $hi)))" \
        >/dev/null 2>&1
}

# A Python in range to make the environment with.
py=
if command -v pyenv >/dev/null 2>&1; then
    v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.[0-9]+(\.[0-9]+)?$' | sort -V |
        while read -r c; do
            m=${c#3.}; m=${m%%.*}
            [ "$m" -ge "$lo" ] && [ "$m" -le "$hi" ] && echo "$c"
        done | tail -1)
    [ -n "$v" ] && py=$(pyenv root)/versions/$v/bin/python3
fi
if [ -z "$py" ]; then
    for m in $(seq "$hi" -1 "$lo") ""; do
        c=python3${m:+.$m}
        if command -v "$c" >/dev/null 2>&1 && in_range "$c"; then
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
        say "no Python 3.$lo to 3.$hi (pyenv, PATH) and no uv to install one"
        exit 0
    fi
fi

started=$SECONDS
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if [ -n "$uv" ]; then
    UV_PYTHON_INSTALL_DIR=$cache/uv-python "$uv" venv -q --seed --python "3.$lo" "$venv" \
            >"$venv.log" 2>&1 ||
        { say "uv could not make a Python 3.$lo environment (see $venv.log)"; exit 0; }
else
    "$py" -m venv "$venv" >/dev/null 2>&1 ||
        { say "$py -m venv failed"; exit 0; }
fi
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}" \
        >"$venv.log" 2>&1; then
    say "could not install ${packages[*]} from PyPI (see $venv.log)"
    rm -rf "$venv"
    exit 0
fi
touch "$stamp"
echo "bfcshim: $framework $version installed in $venv ($((SECONDS - started)) s)" >&2
echo "$venv"
