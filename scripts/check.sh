#!/usr/bin/env bash
# scripts/check.sh - builds bfcshim in every configuration CI cares about and
# runs the whole test suite in each; the last line reads "N passed, M failed".
#
#   default    release + LTO build (what users run): every suite (real JAX,
#              suite jax, only here: sanitizer builds do not define it),
#              then the e2e suite again with the fake's cuMemFree not
#              synchronising (FAKECUDA_FREE_NO_SYNC=1)
#   asan       AddressSanitizer + UndefinedBehaviorSanitizer: every suite
#   tsan       ThreadSanitizer: the multi-threaded suites and the shim end to end
#   libfuzzer  clang + libFuzzer: a 30-second session per fuzz target
#
# Build directories go under build-check/ and are reused between runs.
# BFCSHIM_CHECK_ONLY="default asan" limits the configurations.
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
# What the tests need; a cold machine also makes the JAX and TensorFlow
# environments here (a few minutes, then cached: scripts/framework-venv.sh).
deps_started=$SECONDS
scripts/deps.sh --with-tests || exit 1
echo "deps: $((SECONDS - deps_started)) s"

passed=0 failed=0 skipped=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1

# count BUILDDIR: adds meson's per-test results from testlog.json
count() {
    local log=$1/meson-logs/testlog.json
    [ -f "$log" ] || return
    read -r p f s < <(python3 - "$log" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"):
        p += 1
    elif r == "SKIP":
        s += 1
    else:
        f += 1
print(p, f, s)
PY
)
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    echo "  $p passed, $f failed, $s skipped"
}

# config NAME [meson setup args] -- [meson test args]
config() {
    local name=$1; shift
    local setup=() tests=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do setup+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    tests=("$@")
    case " ${BFCSHIM_CHECK_ONLY:-default asan tsan libfuzzer} " in
        *" $name "*) ;;
        *) return ;;
    esac
    local dir=$root/build-check/$name
    local started=$SECONDS
    echo "== $name"
    if [ -d "$dir" ]; then
        meson setup --reconfigure "$dir" "${setup[@]}" >"$dir.setup.log" 2>&1
    else
        mkdir -p "$root/build-check"
        meson setup "$dir" "${setup[@]}" >"$dir.setup.log" 2>&1
    fi || { echo "  setup failed (see $dir.setup.log)"; failed=$((failed + 1)); return; }
    if ! meson compile -C "$dir" >"$dir.build.log" 2>&1; then
        echo "  build failed:"; grep -E "error|FAILED" "$dir.build.log" | head -20
        failed=$((failed + 1)); return
    fi
    rm -f "$dir/meson-logs/testlog.json"
    local built=$SECONDS
    meson test -C "$dir" --print-errorlogs "${tests[@]}" >"$dir.test.log" 2>&1
    grep -E "^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)" "$dir.test.log" | sed 's/^/  /'
    count "$dir"
    echo "  $name: $((built - started)) s to build, $((SECONDS - built)) s to test"
}

config default -- 
# The demo, as a newcomer runs it, on the default build: it must run to its
# last step (one more test in the count).
case " ${BFCSHIM_CHECK_ONLY:-default asan tsan libfuzzer} " in
    *" default "*)
        echo "== demo"
        demo_started=$SECONDS
        if BFCSHIM_BUILD=build-check/default scripts/demo.sh build-check/demo-out \
                >build-check/demo.log 2>&1 &&
            grep -q "^== 6/6" build-check/demo.log && grep -q "efficiency" build-check/demo.log &&
            [ -s build-check/demo-out/report.html ]; then
            passed=$((passed + 1)); echo "  demo ok"
        else
            failed=$((failed + 1)); echo "  demo FAILED:"; tail -20 build-check/demo.log
        fi
        echo "  demo: $((SECONDS - demo_started)) s" ;;
esac
# The e2e suite again on the default build, with the fake's cuMemFree not
# synchronising (FAKECUDA_FREE_NO_SYNC=1): cuda.h says only that it "may",
# and the shim must not rely on it; the fake's default keeps the
# synchronisation that real clients rely on (tests/fake_cuda/fake_cuda.h).
# The tests that pin the default set FAKECUDA_FREE_NO_SYNC=0 themselves.
case " ${BFCSHIM_CHECK_ONLY:-default asan tsan libfuzzer} " in
    *" default "*)
        echo "== free-no-sync (e2e suite, default build)"
        nosync_started=$SECONDS
        rm -f build-check/default/meson-logs/testlog.json
        if [ -f build-check/default/build.ninja ]; then
            FAKECUDA_FREE_NO_SYNC=1 meson test -C build-check/default --print-errorlogs \
                --suite e2e >build-check/free-no-sync.test.log 2>&1
            grep -E "^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)" build-check/free-no-sync.test.log |
                sed 's/^/  /'
            count build-check/default
        else
            failed=$((failed + 1)); echo "  no default build"
        fi
        echo "  free-no-sync: $((SECONDS - nosync_started)) s" ;;
esac
config asan -Db_sanitize=address,undefined -Db_lundef=false -Db_lto=false \
    -Dbuildtype=debugoptimized -Dproperty_ops=100000 -- --timeout-multiplier 4
config tsan -Db_sanitize=thread -Db_lundef=false -Db_lto=false \
    -Dbuildtype=debugoptimized -- --suite threads --suite e2e --timeout-multiplier 4
CC=clang config libfuzzer -Dfuzz=true -Db_lto=false -Dbuildtype=debugoptimized \
    -- --suite libfuzzer

echo "($skipped skipped: tests that need a GPU or a tool this machine lacks)"
echo "total: $SECONDS s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
