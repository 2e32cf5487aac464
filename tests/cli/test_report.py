#!/usr/bin/env python3
"""`bfcshim report` end to end, checked in headless Chromium: a job run under
the shim (trace + stats), an A/B run, a trace with an allocation failure;
the page must load with no script error and draw what it should, checked on
the DOM and on a screenshot.

usage: test_report.py BFCSHIM WORKLOAD FAKE_CUDA_DIR WORKDIR
Skips (77) when no chromium is installed (scripts/deps.sh --with-tests installs it).
"""
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

bfcshim, workload, fake_dir, work = sys.argv[1:5]
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if not chromium:
    print("chromium is not installed: skipping")
    sys.exit(77)
testcheck.fresh_dir(work)
env = testcheck.fake_cuda_env(fake_dir)
check = testcheck.Checks()


def sh(*args):
    p = subprocess.run(list(args), env=env, capture_output=True, text=True)
    check(p.returncode == 0, f"{args}: {p.returncode} {p.stderr[-1500:]}")
    return p


def path(name):
    return os.path.join(work, name)


def page_data(name):
    """The JSON block a report page carries."""
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>',
                                open(path(name)).read(), re.S).group(1))


# A job under the shim, its A/B, and a trace whose job hit a failure.
sh(bfcshim, "run", "--trace", path("job.csv"), "--stats-file", path("job.json"), "--",
   workload, "0", "4")
ab = sh(bfcshim, "ab", "--repeat", "2", "--json", "--metric", r"samples/s ([0-9.]+)",
        "--metric-name", "samples/s", "--", workload, "0", "2")
open(path("ab.json"), "w").write(ab.stdout)
with open(path("oom.csv"), "w") as f:
    f.write("Thread,Time,Action,Pointer,Size,Stream\n")
    for i in range(8):
        f.write(f"1,10:00:00:{i:06d},allocate,0x{0x10000000 + i * 0x100000:x},{1 << 20},0\n")
    f.write("1,10:00:01:000000,free,0x10200000,0,0\n")
    f.write("1,10:00:02:000000,allocate failure,0x0,67108864,0\n")

sh(bfcshim, "report", path("job.csv"), "--stats", path("job.json"), "--ab", path("ab.json"),
   "-o", path("job.html"))
sh(bfcshim, "report", path("oom.csv"), "-o", path("oom.html"))
# Sizes in every power of two from 1 B to 1 GiB: 31 buckets, too many for a
# label under each bar.
with open(path("wide.csv"), "w") as f:
    f.write("Thread,Time,Action,Pointer,Size,Stream\n")
    for i in range(31):
        f.write(f"1,10:00:00:{i:06d},allocate,0x{(i + 1) << 32:x},{1 << i},0\n")
    for i in range(31):
        f.write(f"1,10:00:01:{i:06d},free,0x{(i + 1) << 32:x},0,0\n")
sh(bfcshim, "report", path("wide.csv"), "-o", path("wide.html"))
# A job that runs across midnight: RMM's Time column is the time of day.
with open(path("midnight.csv"), "w") as f:
    f.write("Thread,Time,Action,Pointer,Size,Stream\n")
    f.write("1,23:59:58:500000,allocate,0x10000000,1048576,0\n")
    f.write("1,23:59:59:500000,allocate,0x20000000,4194304,0\n")
    f.write("1,00:00:00:500000,allocate,0x30000000,8388608,0\n")
    f.write("1,00:00:01:500000,free,0x30000000,0,0\n")
sh(bfcshim, "report", path("midnight.csv"), "-o", path("midnight.html"))
data = page_data("midnight.html")
check(data["series"]["x"] == [0.0, 1.0, 2.0, 3.0] and data["series"]["peak_x"] == 2.0,
      f"times across midnight keep counting: {data['series']['x']}, peak at "
      f"{data['series']['peak_x']} s")
# Which pool the maps show. Without --stats, the job's statistics next to its
# trace (job.csv -> job.json) are used; without any, the smallest pool, and
# the page says plainly that it is not the job's.
p = sh(bfcshim, "report", path("job.csv"), "-o", path("sibling.html"))
d = page_data("sibling.html")
check(d["pool_kind"] == "job" and d["pool_bytes"] == 768 << 20 and
      "next to the trace" in p.stderr, f"sibling stats used: {d['pool_kind']} {p.stderr}")
check(page_data("oom.html")["pool_kind"] == "smallest", "no stats: the smallest pool")

# Inputs that are not what they claim are refused, nothing written.
with open(path("broken.json"), "w") as f:
    f.write('{"version": 1, "pools": [{"bytes_limit": 5')
for args, words in ((["--stats", path("ab.json")], "not a bfcshim statistics file"),
                    (["--stats", path("broken.json")], "not JSON (a missing"),
                    (["--ab", path("job.json")], "not a bfcshim ab --json result"),
                    (["--stats", path("missing.json")], "No such file")):
    p = subprocess.run([bfcshim, "report", path("job.csv"), "-o", path("refused.html"), *args],
                       env=env, capture_output=True, text=True)
    check(p.returncode == 2 and words in p.stderr and not os.path.exists(path("refused.html")),
          f"report {args}: {p.returncode} {p.stderr}")

# An output that cannot be a file (a folder, or a missing folder's file):
# said before any work, in one line, with the usage error's status.
os.makedirs(path("outdir"), exist_ok=True)
for out, words in ((path("outdir"), "is a folder"), (path("outdir") + "/", "is a folder"),
                   (path("nodir/x.html"), "does not exist")):
    p = subprocess.run([bfcshim, "report", path("job.csv"), "-o", out],
                       env=env, capture_output=True, text=True)
    check(p.returncode == 2 and words in p.stderr and len(p.stderr.splitlines()) == 1,
          f"report -o {out}: {p.returncode} {p.stderr}")

# A short job as the shim records it: 120 events inside one 4 ms clock
# tick share a timestamp. The chart must go by event order (it used to plot
# every point at x = 0 under an "events" axis from 0 to 1).
with open(path("coarse.csv"), "w") as f:
    f.write("Thread,Time,Action,Pointer,Size,Stream\n")
    for i in range(60):
        f.write(f"1,10:00:00:004000,allocate,0x{(i + 1) << 24:x},{(i + 1) << 10},0\n")
    for i in range(60):
        f.write(f"1,10:00:00:004000,free,0x{(i + 1) << 24:x},0,0\n")
sh(bfcshim, "report", path("coarse.csv"), "-o", path("coarse.html"))
data = page_data("coarse.html")
check(not data["has_times"] and data["series"]["x"] == list(range(120)) and
      data["series"]["peak_x"] == 59,
      f"one timestamp: by event order: {data['series']['x'][:5]}..., peak at "
      f"{data['series']['peak_x']}")


def render(html, shot=None, fragment=""):
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
            "--window-size=1200,1800"]
    args += [f"--screenshot={shot}"] if shot else ["--dump-dom"]
    p = subprocess.run(args + ["file://" + html + fragment], capture_output=True, text=True,
                       timeout=120, cwd=work)
    errors = [l for l in p.stderr.splitlines()
              if "Uncaught" in l or ("CONSOLE" in l and "error" in l.lower())]
    check(not errors, f"console errors in {html}: {errors}")
    return p.stdout


dom = render(path("job.html"))
check(re.search(r'<p id="pool-note">[^<]*the job\'s own pool of 768.0 MiB', dom) is not None,
      "the page names the job's pool")
check('data-ready="1"' in dom and "data-error" not in dom, "job page rendered without error")
live = re.search(r'<svg id="live".*?</svg>', dom, re.S)
check(live and "<polyline" in live.group(0) and 'id="peak-marker"' in live.group(0),
      "live-bytes chart with the peak marked")
m0 = re.search(r'<svg id="map-0".*?</svg>', dom, re.S)
rects = re.findall(r"<rect[^>]*><title>([^<]*)</title>", m0.group(0) if m0 else "")
check(len(rects) >= 2, f"map at the peak has {len(rects)} blocks")
check(any(re.match(r"0x[0-9a-f]+: .* allocated, requested .*, age \d+ allocations", t)
          for t in rects), "hover text: address, size, age")
hist = json.loads(re.search(
    r'<script type="application/json" id="data">(.*?)</script>', dom, re.S).group(1))["hist"]
check(dom.count('class="bar"') == len(hist), "one histogram bar per size bucket")
check(all(b["lo"] == 2 * a["lo"] for a, b in zip(hist, hist[1:])),
      "histogram buckets are consecutive powers of two (empty ones kept)")
check(re.search(r'<svg id="hist"[^>]*data-label-overlaps="0"', dom) is not None,
      "histogram labels do not overlap")
check('<table id="ab">' in dom and "samples/s" in dom and "driver allocation calls" in dom,
      "the A/B table")
ab_rows = re.search(r'<table id="ab">(.*?)</table>', dom, re.S)
check(ab_rows and ab_rows.group(1).count("<tr>") == 8, "A/B rows")
check('<table id="stats">' in dom and "peak_pool_bytes" in dom, "the stats table")

# Fragmentation over time and the time cursor, from the job's replay: the
# data add up, and the page draws them and follows #cursor=N.
d = page_data("job.html")
fr = d["frag"]
n = len(fr["x"])
check(n == min(400, d["events"]) and len(fr["largest"]) == n and len(fr["free_by_class"]) == 4
      and all(len(c) == n for c in fr["free_by_class"]), f"fragmentation series: {n} samples")
free = [sum(c[i] for c in fr["free_by_class"]) for i in range(n)]
check(all(fr["largest"][i] <= free[i] <= d["pool_bytes"] for i in range(n)),
      "largest free block <= free bytes <= pool")
check(fr["event"] == sorted(fr["event"]) and fr["event"][-1] == d["events"] - 1,
      "samples in event order, the last after the last event")
cm = d["cursor_maps"]
check(len(cm) == 24 and [m["event"] for m in cm] == sorted(m["event"] for m in cm) and
      cm[-1]["event"] == d["events"] - 1, f"24 cursor maps: {[m['event'] for m in cm]}")
# The allocation timeline: at every sample, the grey band plus the bands
# live there add up to the live bytes the trace says (computed here).
tl = d["timeline"]
live, sizes, now, after = {}, {}, 0, []
for line in open(path("job.csv")).read().splitlines()[1:]:
    _, _, action, ptr, size, _ = line.split(",")
    if action == "allocate":
        sizes[ptr] = int(size)
        now += int(size)
    elif action == "free":
        now -= sizes.pop(ptr)
    after.append(now)
check(len(tl["event"]) == min(2000, d["events"]) and len(tl["bands"]) == min(300, d["allocs"]),
      f"timeline: {len(tl['event'])} samples, {len(tl['bands'])} bands")
sums_ok = all(tl["other"][k] + sum(b[2] for b in tl["bands"] if b[0] <= ev < b[1]) == after[ev]
              for k, ev in enumerate(tl["event"]))
check(sums_ok, "grey band + live bands = live bytes at every sample")
check(all(b[3] < b[4] for b in tl["bands"]), "every band spans at least one sample")
# Where each allocation was made (snapshot2csv --frames), found next to the
# trace: each band's tooltip names it; a '<' in it does not break the page.
with open(path("job.frames.txt"), "w") as f:
    f.write("# bfcshim frames v1\n")
    f.write("".join(f"layer{k} model.py:{k} < train model.py:1\n" for k in range(d["allocs"])))
p = sh(bfcshim, "report", path("job.csv"), "-o", path("frames.html"))
check("where allocations were made, from" in p.stderr, f"frames file found: {p.stderr}")
dom = render(path("frames.html"))
check('data-ready="1"' in dom and "made at:\n  layer79 model.py:79\n  train model.py:1" in dom,
      "band tooltips say where the allocation was made")
os.unlink(path("job.frames.txt"))
# A --frames file that is not one would put wrong places on the chart:
# refused, with the reason. One that only sits next to the trace is left out.
with open(path("notframes.txt"), "w") as f:
    f.write("layer0 model.py:1\n")
p = subprocess.run([bfcshim, "report", path("job.csv"), "--frames", path("notframes.txt"), "-o",
                    path("x.html")], env=env, capture_output=True, text=True)
check(p.returncode == 2 and f"--frames {path('notframes.txt')}: not a frames file" in p.stderr,
      f"--frames of another file refused: {p.returncode} {p.stderr}")
shutil.copy(path("notframes.txt"), path("job.frames.txt"))
p = sh(bfcshim, "report", path("job.csv"), "-o", path("x.html"))
check("next to the trace: not a frames file" in p.stderr, f"sibling left out: {p.stderr}")
os.unlink(path("job.frames.txt"))
# Nothing to report is refused, not drawn as a chart of zeros.
for name, text in [("empty.csv", ""), ("header.csv", "Thread,Time,Action,Pointer,Size,Stream\n")]:
    with open(path(name), "w") as f:
        f.write(text)
    p = subprocess.run([bfcshim, "report", path(name), "-o", path("x.html")], env=env,
                       capture_output=True, text=True)
    check(p.returncode != 0 and f"{path(name)}: no allocations" in p.stderr and
          len(p.stderr.splitlines()) == 1, f"report {name}: {p.returncode} {p.stderr}")
dom = render(path("job.html"), fragment="#zoom=10-50")
check(re.search(r'<svg id="timeline"[^>]*data-view="10-50"', dom) is not None and
      "double-click to zoom out" in dom, "the timeline opens zoomed where the address said")
bands_drawn = re.search(r'<svg id="timeline"[^>]*data-bands="(\d+)"', dom)
check(bands_drawn and 0 < int(bands_drawn.group(1)) < len(tl["bands"]),
      f"zoomed: only the bands live in view are drawn ({bands_drawn and bands_drawn.group(1)})")
# The same trace under another placement, side by side in the same pool.
sh(bfcshim, "report", path("job.csv"), "--compare", "low", "-o", path("compare.html"))
c = page_data("compare.html")["compare"]
check(c and c["policy"] == "low" and len(c["frag"]["largest"]) == len(d["frag"]["largest"]) and
      c["min_pool_bytes"] > 0 and c["base_min_pool_bytes"] > 0 and len(c["maps"]) >= 1,
      f"compare data: {c and {k: c[k] for k in ('policy', 'min_pool_bytes')}}")
dom = render(path("compare.html"))
check('<div id="compare-section">' in dom and 'id="map-compare-0"' in dom and
      'id="map-compare-1"' in dom and "Side by side: aligned and low" in dom,
      "side by side: both maps at the peak")
check(re.search(r'<svg id="compare"[^>]*data-better="\d+"[^>]*data-worse="\d+"', dom) is not None,
      "the largest-free-block difference drawn")
p = subprocess.run([bfcshim, "report", path("job.csv"), "--compare", "best", "-o",
                    path("refused.html")], env=env, capture_output=True, text=True)
check(p.returncode == 2 and "--compare 'best'" in p.stderr, f"bad --compare: {p.stderr}")
dom = render(path("job.html"), fragment="#cursor=5")
check('<div id="compare-section" hidden=""' in dom, "no comparison unless asked")
check('data-cursor="5"' in dom, "the cursor opened where the address said")
check(f"At the cursor (event {cm[5]['event']})" in dom and 'id="map-cursor"' in dom,
      "the map under the cursor is drawn")
frag_svg = re.search(r'<svg id="frag".*?</svg>', dom, re.S)
check(frag_svg and frag_svg.group(0).count('class="hole"') == 4 and
      'class="largest"' in frag_svg.group(0) and 'class="cursor"' in frag_svg.group(0),
      "fragmentation chart: four hole classes, the largest block, the cursor line")

# One x axis for the three charts over the trace (live bytes, the allocation
# timeline, fragmentation), the cursor line in each, round ticks on every
# axis, and every row of a small pool's map. A trace whose times change at
# every event (10 ms apart, some sizes recurring) goes by time; the timeline
# counted events while the two others showed seconds, its cursor line was
# missing, the byte axes read 0, 52.5, 105, 157.5 MiB, and a 1 MiB pool's map
# drew 10 of its 12 rows.
def svg_of(dom, sid):
    m = re.search(r'<svg id="%s".*?</svg>' % sid, dom, re.S)
    return m.group(0) if m else ""


def tick_labels(svg, cls):
    """The chart's tick labels (on a page before the classes: its numbers
    anchored as ticks are)."""
    return re.findall(r'<text[^>]*class="%s"[^>]*>([^<]*)</text>' % cls, svg) or \
        [t for t in re.findall(r'<text[^>]*text-anchor="%s"[^>]*>([^<]*)</text>' %
                               ("end" if cls == "y-tick" else "middle"), svg)
         if re.match(r"[0-9.]+( |$)", t)]


UNITS = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4}


def round_scale(labels, in_bytes):
    """The labels are 0, s, 2s, ... with s 1, 2 or 5 times a power of ten
    in the unit of the largest (bytes: B, KiB, ...)."""
    try:
        vals, unit = [], 0
        for t in labels:
            n, _, u = t.partition(" ")
            unit = UNITS.get(u, 0) if in_bytes and u else unit
            vals.append(float(n) * 1024 ** (UNITS.get(u, 0) if in_bytes and u else 0))
    except ValueError:
        return False
    if len(vals) < 2 or min(vals) != 0:
        vals = [0.0] + vals  # the histogram leaves its 0 out
    vals.sort()
    step = vals[1] - vals[0]
    if step <= 0 or any(abs((b - a) - step) > step * 1e-6 for a, b in zip(vals, vals[1:])):
        return False
    s = step / 1024 ** unit
    mant = s / 10 ** math.floor(math.log10(s) + 1e-9)
    return any(abs(mant - m) < 1e-6 for m in (1, 2, 5))


with open(path("timed.csv"), "w") as f:
    f.write("Thread,Time,Action,Pointer,Size,Stream\n")
    live_ptrs = []
    for i in range(300):
        t = 10000 * (i + 1)
        when = f"10:00:{t // 1000000:02d}:{t % 1000000:06d}"
        if live_ptrs and (i % 3 == 2 or len(live_ptrs) > 20):
            f.write(f"1,{when},free,0x{live_ptrs.pop(i % len(live_ptrs)):x},0,0\n")
        else:
            live_ptrs.append(0x10000000 + i * 0x1000000)
            f.write(f"1,{when},allocate,0x{live_ptrs[-1]:x},{((i * 7) % 40 + 1) << 18},0\n")
sh(bfcshim, "report", path("timed.csv"), "-o", path("timed.html"))
timed = page_data("timed.html")
check(timed["has_times"] and len(timed["timeline"].get("x", [])) == len(timed["timeline"]["event"]),
      "a trace with usable times: the timeline's samples carry their times")
dom = render(path("timed.html"), fragment="#cursor=7")
charts = {sid: svg_of(dom, sid) for sid in ("live", "timeline", "frag")}
axes = {sid: (re.findall(r">(time since the first event \([^)]*\)|events)<", svg),
              tick_labels(svg, "x-tick")) for sid, svg in charts.items()}
check(axes["live"][0] == ["time since the first event (s)"] and
      axes["timeline"] == axes["live"] == axes["frag"],
      f"one x axis for the three charts: {axes}")
cursors = {sid: re.findall(r'<line[^>]*class="cursor"[^>]*x1="([0-9.]+)"', svg)
           for sid, svg in charts.items()}
check(all(len(c) == 1 for c in cursors.values()) and
      max(float(c[0]) for c in cursors.values()) - min(float(c[0]) for c in cursors.values()) < 0.5,
      f"the cursor line in the three charts, at one place: {cursors}")
for page in ("timed.html", "job.html", "oom.html"):
    page_dom = dom if page == "timed.html" else render(path(page))
    for sid in ("live", "timeline", "frag"):
        ys = tick_labels(svg_of(page_dom, sid), "y-tick")
        check(round_scale(ys, True), f"{page} {sid}: round byte ticks: {ys}")
        xs = tick_labels(svg_of(page_dom, sid), "x-tick")
        check(round_scale(xs, False), f"{page} {sid}: round x ticks: {xs}")
    hs = tick_labels(svg_of(page_dom, "hist"), "y-tick")
    check(round_scale(hs, False), f"{page} hist: round counts: {hs}")
# A pool of 1 MiB: its rows are 87381.33 bytes, not a whole number.
with open(path("small.csv"), "w") as f:
    f.write("Thread,Time,Action,Pointer,Size,Stream\n")
    for i in range(4):
        f.write(f"1,10:00:00:{i * 1000:06d},allocate,0x{0x10000000 + i * 0x40000:x},{1 << 18},0\n")
    for i in range(4):
        f.write(f"1,10:00:01:{i * 1000:06d},free,0x{0x10000000 + i * 0x40000:x},0,0\n")
sh(bfcshim, "report", path("small.csv"), "--pool-size", "1MiB", "-o", path("small.html"))
dom = render(path("small.html"))
rows = {float(y) for y in re.findall(r'<rect[^>]* y="([0-9.]+)"', svg_of(dom, "map-0"))}
check(len(rows) == 12, f"a 1 MiB pool full at the peak: its map draws all 12 rows, not {len(rows)}")

# A million events: the page stays a few MB (maps merge sub-pixel chunks,
# series are decimated) and draws in seconds. Left out under sanitizers,
# where the engine runs ten times slower.
if os.environ.get("REPORT_TEST_MILLION", "1") == "1":
    sh(bfcshim, "tracegen", "--model", "churn", "--live", "10000", "--ops", "1000000", "-o",
       path("big.csv.gz"))
    t0 = time.time()
    sh(bfcshim, "report", path("big.csv.gz"), "-o", path("big.html"))
    made = time.time() - t0
    size = os.path.getsize(path("big.html"))
    dom = render(path("big.html"), fragment="#cursor=23")
    load = re.search(r'data-load-ms="(\d+)"', dom)
    print(f"10^6 events: report {made:.1f} s, page {size / 1e6:.2f} MB, "
          f"drawn in {load.group(1) if load else '?'} ms")
    check('data-ready="1"' in dom and 'data-cursor="23"' in dom and size < 8e6,
          f"a 10^6-event page: {size} bytes, ready and at the last cursor moment")

dom = render(path("wide.html"))
check(re.search(r'<svg id="hist"[^>]*data-label-overlaps="0"', dom) is not None and
      dom.count('class="bar"') == 31, "31 buckets, labels thinned out so none overlap")
check(">time since the first event (s)<" in dom, "the time axis in seconds for a 1 s trace")

dom = render(path("coarse.html"))
live = re.search(r'<svg id="live".*?</svg>', dom, re.S)
xs = {round(float(p.split(",")[0])) for p in
      re.search(r'<polyline points="([^"]*)"', live.group(0)).group(1).split()} if live else set()
check(">events<" in dom and len(xs) > 100, f"drawn along the events axis: {len(xs)} columns")

dom = render(path("oom.html"))
check('data-ready="1"' in dom, "oom page rendered")
check(re.search(r'<p id="pool-note">[^<]*smallest pool that serves it[^<]*not the job\'s own',
                dom) is not None, "the page says the maps are not the job's pool")
check("at the job's first allocation failure" in dom and 'id="map-1"' in dom,
      "a map at the failure and one at the peak")
check("request of 64.0 MiB" in dom, "the failing request named")


def png_pixels(png):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG."""
    data = open(png, "rb").read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", "a PNG")
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            ch = {2: 3, 6: 4}[ctype]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, prev, out = zlib.decompress(idat), w * ch, bytearray(w * ch), []
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - ch] if i >= ch else 0
            b, c = prev[i], prev[i - ch] if i >= ch else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append([tuple(line[x * ch:x * ch + 3]) for x in range(w)])
        prev = line
    return w, h, out


render(path("job.html"), path("job.png"))
w, h, px = png_pixels(path("job.png"))
check((w, h) == (1200, 1800), f"screenshot size {w}x{h}")
flat = [p for row in px for p in row]
inked = sum(1 for p in flat if p != (255, 255, 255)) / len(flat)
check(inked > 0.05, f"the screenshot is {inked:.1%} drawn")
colours = set(flat)
check(any(abs(r - 214) < 12 and abs(g - 39) < 12 and abs(b - 40) < 12 for r, g, b in colours),
      "the peak marker is visible")
check(any(r > 150 and 60 < g < 140 and b < 80 for r, g, b in colours),
      "allocated blocks are drawn on the map")
check(any(abs(r - 91) < 8 and abs(g - 143) < 8 and abs(b - 214) < 8 for r, g, b in colours),
      "histogram bars are drawn")

check.finish()
