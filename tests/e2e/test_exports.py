#!/usr/bin/env python3
"""libbfcshim.so links against no CUDA library and exports exactly the
symbols its version script lists (the doors and dlsym), nothing else."""
import re
import subprocess
import sys

lib, script = sys.argv[1], sys.argv[2]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


dynamic = subprocess.run(["readelf", "-d", lib], check=True, capture_output=True,
                         text=True).stdout
needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
print("NEEDED:", ", ".join(needed))
for n in needed:
    if n.startswith("libcuda") or n.startswith("libcudart"):
        fail(f"NEEDED {n}: the shim must find CUDA at run time, not link it")

text = open(script).read()
text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
glob = text.split("global:")[1].split("local:")[0]
listed = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", glob))

symbols = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
exported = set()
for line in symbols.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[1] in "TtWiD":
        exported.add(parts[2].split("@")[0])
for s in sorted(exported - listed):
    fail(f"exported but not in the version script: {s}")
for s in sorted(listed - exported):
    fail(f"listed in the version script but not defined: {s}")
print(f"{len(exported)} exported symbols")
sys.exit(1 if failures else 0)
