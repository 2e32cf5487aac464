#!/usr/bin/env python3
"""test_driver_facts.py LIBBFCSHIM FAKE_CUDA_DIR DRIVER_FACTS WORKDIR -
scripts/gpu/driver_facts.py on the fake driver, as the rehearsal of
scripts/gpu-proof.sh runs it (GPU_PROOF_REHEARSE=1, step quick-owed), so
that its probes work before a GPU's minutes are spent on them.

The two facts the fake takes a reading of must follow its switches: the
free-sync probe answers "waits" under FAKECUDA_FREE_NO_SYNC=0 and "does not
wait" under =1, the legacy-destroyed probe "does not wait" under
FAKECUDA_LEGACY_SKIPS_DESTROYED=1 and "waits" under =0, each with its
controls sound (the stream still busy when the question is put, the legacy
stream waiting for a live blocking stream, its synchronisation alone not).
Under the shim every probe runs and the plain free does not wait (the
pool's free, docs/limitations.md, "Plain frees do not synchronise")."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

lib, fake_dir, script, work = sys.argv[1:5]
testcheck.fresh_dir(work)
check = testcheck.Checks()


def run(tag, **env):
    # the rehearsal's sizes and devices (scripts/gpu-proof.sh, facts_env)
    e = testcheck.fake_cuda_env(fake_dir, FAKECUDA_DEVICES="1", **env)
    p = subprocess.run([sys.executable, script, "--size", "64MiB", "--busy", "4", "--arm", tag],
                       env=e, capture_output=True, text=True, timeout=120)
    with open(os.path.join(work, tag + ".log"), "w") as f:
        f.write(p.stdout + p.stderr)
    check(p.returncode == 0, f"{tag}: exited {p.returncode}: {p.stderr[-1500:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    check(len(lines) == 1, f"{tag}: one RESULT line ({len(lines)})")
    return json.loads(lines[-1][len("RESULT "):]) if lines else {}


ANSWERS = ("waits", "does not wait", "inconclusive")


def free_sync(res, tag, want):
    f = res.get("free_sync", {})
    check(f.get("answer") == want, f"{tag}: free_sync answers {want!r}: {f}")
    for kind in ("non_blocking", "blocking"):
        o = f.get(kind, {})
        check(o.get("free") == 0 and o.get("query_before") == 600 and
              o.get("answer") == want and isinstance(o.get("free_ms"), float),
              f"{tag}: free_sync {kind}: busy before the free, {want!r} after it: {o}")


def legacy(res, tag, want):
    d = res.get("legacy_destroyed", {})
    check(d.get("answer") == want, f"{tag}: legacy_destroyed answers {want!r}: {d}")
    alone = d.get("sync_alone_alive", {})
    check(alone.get("waits") is False,
          f"{tag}: the legacy stream's synchronisation alone is no action: {alone}")
    check(d.get("wait_on_complete_event_is_action") is True,
          f"{tag}: the fake's wait on a complete event is a legacy-stream action: {d}")
    for action in ("record", "wait"):
        v = d.get(action, {})
        check(v.get("answer") == want, f"{tag}: legacy_destroyed {action} answers {want!r}: {v}")
        check(v.get("alive", {}).get("waits") is True,
              f"{tag}: {action}: the legacy stream waits for a live blocking stream: {v}")
        dest = v.get("destroyed", {})
        check(dest.get("destroy") == 0 and dest.get("query_before") == 600 and
              dest.get("action") == 0, f"{tag}: {action}: b destroyed, still busy: {dest}")


base = {"FAKECUDA_FREE_NO_SYNC": "0", "FAKECUDA_LEGACY_SKIPS_DESTROYED": "1"}
native = run("native", **base)
free_sync(native, "native", "waits")
legacy(native, "native", "does not wait")
for key in ("stream_ids", "ctx_ids", "relaxed_sync", "free_async"):
    check(key in native and "error" not in native[key], f"native: {key}: {native.get(key)}")

no_sync = run("free-no-sync", **dict(base, FAKECUDA_FREE_NO_SYNC="1"))
free_sync(no_sync, "free-no-sync", "does not wait")

waits = run("legacy-waits", **dict(base, FAKECUDA_LEGACY_SKIPS_DESTROYED="0"))
legacy(waits, "legacy-waits", "waits")

shim = run("shim", LD_PRELOAD=lib, BFCSHIM_LOG_FILE=os.path.join(work, "shim-bfcshim.log"), **base)
check(shim.get("shim_loaded") is True, f"shim: loaded: {shim.get('shim_loaded')}")
free_sync(shim, "shim", "does not wait")
check(shim.get("legacy_destroyed", {}).get("answer") in ANSWERS,
      f"shim: legacy_destroyed answered: {shim.get('legacy_destroyed')}")
check.finish()
