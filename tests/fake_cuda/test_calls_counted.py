#!/usr/bin/env python3
"""Every driver entry point of the fake counts its calls: each exported cu*
function of the fake driver's files opens with CALLED() (or CALLED_AS, under the
symbol an __asm__ label exports it as), so that the call counts the
shim-level benchmarks report (fakecuda_api.calls) miss no entry point, and a
new one added without it fails here rather than go uncounted.

usage: test_calls_counted.py FAKE_DRIVER_SOURCE...
"""
import re
import sys

src = "".join(open(path).read() for path in sys.argv[1:])
defined, missing = 0, []
for m in re.finditer(r"^EXPORT [A-Za-z_ ]+?\**(cu\w*)\(", src, re.M):
    depth, i = 1, m.end()
    while depth:  # to the end of the parameter list
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    rest = src[i:].lstrip()
    if rest.startswith(";"):
        continue  # a declaration
    defined += 1
    # CALLED(), or CALLED_AS("symbol") where an __asm__ label gives the
    # function its exported name
    if not re.match(r'\{\s*CALLED(\(\)|_AS\("cu\w*"\));', rest):
        missing.append(m.group(1))
print("%d entry points defined, %d without CALLED(): %s" % (defined, len(missing),
                                                          " ".join(missing) or "none"))
sys.exit(1 if missing or defined < 100 else 0)
