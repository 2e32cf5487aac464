#!/usr/bin/env python3
"""Output files against another local user who can write their directory
(a shared /tmp): a symbolic link planted at an output's name, or at the
name of its temporary, must never lead the shim or the bfcshim command to
write the file it points at, and a PATH.request file counts only when it
is a regular file of our own. Each refusal is one log line naming the
file; the program runs on.

Each case plants links to a "victim" file and checks that it is unchanged
afterwards. The shim's temporary for the stats file used to be
PATH.tmp<pid>: the link is planted between fork and exec, where the child's
pid is the program's.

usage: test_output_files.py BFCSHIM WORKLOAD LIBBFCSHIM FAKE_CUDA_DIR WORKDIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testcheck  # noqa: E402

bfcshim, workload, lib, fake_dir, work = sys.argv[1:6]
testcheck.fresh_dir(work)
check = testcheck.Checks()

VICTIM = "a file the job can write and nobody asked it to\n"


def path(name):
    return os.path.join(work, name)


def victim(name):
    p = path(name)
    with open(p, "w") as f:
        f.write(VICTIM)
    return p


def untouched(p, what):
    check(open(p, "rb").read() == VICTIM.encode(),
          f"{what}: {p} was written through a planted link")


OTHER_UID = 65534  # "another local user": the links below are planted as theirs


def plant(target, where):
    """A link at `where` to `target`, owned by another user (tests run as
    root: lchown makes it theirs, as if they had made it)."""
    os.symlink(target, where)
    os.lchown(where, OTHER_UID, OTHER_UID)


def link(name, target):
    plant(target, path(name))
    return path(name)


def log_of(name):
    p = path(name + ".log")
    return open(p).read() if os.path.exists(p) else ""


def shim_run(name, steps="2", status=0, plant_list=(), **env):
    """The stand-in job under the shim, logging to NAME.log unless told;
    plant: (name made from the pid, target) links made in the child."""
    def plant_links():
        for make, target in plant_list:
            os.symlink(target, make(os.getpid()))
            os.lchown(make(os.getpid()), OTHER_UID, OTHER_UID)
    env.setdefault("BFCSHIM_LOG_FILE", path(name + ".log"))
    e = testcheck.fake_cuda_env(fake_dir, LD_PRELOAD=lib, **env)
    p = subprocess.run([workload, str(status), steps], env=e, capture_output=True, text=True,
                       preexec_fn=plant_links if plant_list else None)
    check(p.returncode == status, f"{name} exited {p.returncode}: {p.stderr[-2000:]}")
    return p


# 1. The stats file's temporary, at the name the shim used to choose.
stats = path("stats.json")
v = victim("victim-stats-tmp")
shim_run("stats-tmp", BFCSHIM_STATS_FILE=stats, plant_list=[(lambda pid: f"{stats}.tmp{pid}", v)])
untouched(v, "stats temporary")
check(not os.path.islink(stats) and json.load(open(stats))["pools"][0]["num_allocs"] == 40,
      "the stats file is written as a file of its own")

# 2. The stats file itself a link: refused, with one line, the link left.
linked = link("linked.json", victim("victim-stats"))
shim_run("stats-link", BFCSHIM_STATS_FILE=linked)
untouched(path("victim-stats"), "stats file")
check(os.path.islink(linked), "the planted stats link is left as it was")
check(log_of("stats-link").count(
    f"BFCSHIM_STATS_FILE: {linked} is a symbolic link; not written") == 1,
    f"the refusal is logged once: {log_of('stats-link')!r}")

# 3. PATH.request: honoured when it is our own regular file, ignored (one
#    line, the file left) when another user owns it or it is a link. Sixty
#    steps are 1200 allocations, past the poll at the 1024th; 150 poll
#    twice, and the refusal is logged once.
asked = path("asked.json")
request = asked + ".request"
open(request, "w").close()
shim_run("request-own", steps="60", BFCSHIM_STATS_FILE=asked)
check(not os.path.exists(request), "our own request is answered and removed")

foreign = path("foreign.json")
open(foreign + ".request", "w").close()
try:
    os.chown(foreign + ".request", 65534, 65534)
except PermissionError:
    print("not root: the request of another user is not tried")
else:
    shim_run("request-foreign", steps="150", BFCSHIM_STATS_FILE=foreign)
    check(os.path.exists(foreign + ".request"), "another user's request is left alone")
    check(log_of("request-foreign").count(f"BFCSHIM_STATS_FILE: {foreign}.request is owned "
                                          f"by uid 65534, not {os.geteuid()}; ignored") == 1,
          f"foreign request logged once: {log_of('request-foreign')!r}")

via_link = path("via-link.json")
ours = path("our-file")
open(ours, "w").close()
plant(ours, via_link + ".request")
shim_run("request-link", steps="150", BFCSHIM_STATS_FILE=via_link)
check(os.path.islink(via_link + ".request"), "a linked request is left alone")
check(log_of("request-link").count(
    f"BFCSHIM_STATS_FILE: {via_link}.request is a symbolic link; ignored") == 1,
    f"linked request logged once: {log_of('request-link')!r}")

# 4. The trace a link: not recording, the job runs on.
trace = link("trace.csv", victim("victim-trace"))
shim_run("trace-link", BFCSHIM_TRACE=trace)
untouched(path("victim-trace"), "trace")
check(f"BFCSHIM_TRACE: {trace} is a symbolic link; not recording" in log_of("trace-link"),
      f"trace refusal logged: {log_of('trace-link')!r}")

# 5. The trace's spool, at the name it used to have (PATH.spool).
spooled = path("spooled.csv")
link("spooled.csv.spool", victim("victim-spool"))
shim_run("trace-spool", BFCSHIM_TRACE=spooled)
untouched(path("victim-spool"), "trace spool")
rows = open(spooled).read().splitlines()
check(len(rows) == 1 + 80, f"the trace is whole: {len(rows) - 1} events (80 expected)")

# 6. The OOM report a link (64 MiB device: the job's first step fails): the
#    report still reaches the log.
report = link("oom.txt", victim("victim-oom"))
shim_run("oom-link", status=1, BFCSHIM_OOM_REPORT=report, FAKECUDA_MEM="64MiB")
untouched(path("victim-oom"), "OOM report")
oom_log = log_of("oom-link")
check(f"BFCSHIM_OOM_REPORT: {report} is a symbolic link; not written" in oom_log,
      f"OOM report refusal logged: {oom_log[-1000:]!r}")
check("==== bfcshim out-of-memory report" in oom_log, "the report is still in the log")

# 7. The log file a link: the log goes to stderr, and says why first.
log_link = link("job.log", victim("victim-log"))
p = shim_run("log-link", BFCSHIM_LOG_FILE=log_link, BFCSHIM_TRACE=path("log-link.csv"),
             BFCSHIM_LOG_LEVEL="info")
untouched(path("victim-log"), "log file")
lines = p.stderr.splitlines()
check(len(lines) > 1 and
      lines[0].endswith(f"BFCSHIM_LOG_FILE: {log_link} is a symbolic link; logging to stderr"),
      f"log refusal first on stderr: {p.stderr[-1000:]!r}")
check("recording allocations to" in p.stderr, "the log itself goes on, on stderr")

# 8. The command's outputs. A trace to work from first.
env = testcheck.fake_cuda_env(fake_dir)


def cmd(*args):
    return subprocess.run([bfcshim, *args], env=env, capture_output=True, text=True)


gpt = ["--model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "128",
       "--batch", "2", "--vocab", "512", "--steps", "2"]
job = path("job.csv")
p = cmd("tracegen", *gpt, "-o", job)
check(p.returncode == 0, f"tracegen: {p.stderr}")

for name, args in {
        "tracegen": ["tracegen", *gpt, "-o"],
        "tracegen-gz": ["tracegen", *gpt, "-o"],
        "plan": ["plan", job, "-o"],
        "report": ["report", job, "-o"],
        "replay-dump": ["replay", "--repeat", "1", job, "--dump-at-failure"],
        "replay-record": ["replay", "--repeat", "1", job, "--record"],
        "ab-stats": ["ab", "--repeat", "1", "--stats-file"],
}.items():
    out = link(name + (".gz" if name.endswith("-gz") else ".out"), victim("victim-" + name))
    tail = ["--", workload, "0", "1"] if name == "ab-stats" else []
    p = cmd(*args, out, *tail)
    untouched(path("victim-" + name), name)
    check(f"{out} is a symbolic link" in p.stderr, f"{name} says why: {p.stderr[-500:]!r}")

# 9. Links nobody else can have planted are followed: the user's own, and the
# system's (BFCSHIM_LOG_FILE=/dev/stderr, a link to /proc/self/fd/2).
mine = path("my-stats.json")
os.symlink(path("my-stats-target.json"), mine)  # ours (euid's)
shim_run("own-link", BFCSHIM_STATS_FILE=mine)
check(os.path.exists(path("my-stats-target.json")) or not os.path.islink(mine),
      "a stats file behind a link of our own is written")
own_log = path("own-log-target.log")
os.symlink(own_log, path("own-log.log"))
shim_run("own-log", BFCSHIM_LOG_FILE=path("own-log.log"), BFCSHIM_LOG_LEVEL="info")
check(os.path.exists(own_log) and "bfcshim[" in open(own_log).read(),
      "a log file behind a link of our own is appended to")
p = shim_run("dev-stderr", BFCSHIM_LOG_FILE="/dev/stderr", BFCSHIM_LOG_LEVEL="info")
check("bfcshim[" in p.stderr and "symbolic link" not in p.stderr,
      f"BFCSHIM_LOG_FILE=/dev/stderr logs to stderr: {p.stderr[-500:]!r}")

# 10. A write that fails (a full disk; /dev/full fails every write with
# ENOSPC) is said, naming the file, and the command exits non-zero: an
# output cut short must not be taken for a whole one. The report page,
# the memory map at failure and the recording wrote into a full disk and
# said they had succeeded (exit 0); the shim's trace and OOM report were
# lost without a word.
FULL = "/dev/full"
for name, args in {
        "tracegen": ["tracegen", *gpt, "-o", FULL],
        "plan": ["plan", job, "-o", FULL],
        "report": ["report", job, "-o", FULL],
        "replay-dump": ["replay", "--repeat", "1", job, "--dump-at-failure", FULL],
        "replay-record": ["replay", "--repeat", "1", job, "--record", FULL],
        "ab-stats": ["ab", "--repeat", "1", "--stats-file", FULL, "--", workload, "0", "1"],
}.items():
    p = cmd(*args)
    check(p.returncode != 0, f"{name} into a full disk exits {p.returncode}")
    check(f"{FULL} cannot be written (No space left on device)" in p.stderr
          or f"{FULL}: No space left on device" in p.stderr,
          f"{name} says the write failed: {p.stderr[-500:]!r}")

shim_run("trace-full", BFCSHIM_TRACE=FULL)
check(f"BFCSHIM_TRACE: {FULL}" in log_of("trace-full"),
      f"a trace that cannot be written is said: {log_of('trace-full')[-500:]!r}")
shim_run("oom-full", status=1, BFCSHIM_OOM_REPORT=FULL, FAKECUDA_MEM="64MiB")
check(f"BFCSHIM_OOM_REPORT: {FULL} cannot be written (No space left on device)"
      in log_of("oom-full"),
      f"an OOM report that cannot be written is said: {log_of('oom-full')[-500:]!r}")

# 11. A stats file that is not a regular file is written into, not
# replaced: the temporary renamed over it replaced a FIFO (or, run as root,
# /dev/null or /dev/stdout: the system's own) with a file, and the reader
# got nothing. The same for a link of the user's own: followed, as the log
# file's is (BFCSHIM_STATS_FILE=/dev/stdout is such a link, of the
# system's, to /proc/self/fd/1; the link here is the same, made by us).
fifo = path("stats.fifo")
os.mkfifo(fifo)
reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
shim_run("stats-fifo", BFCSHIM_STATS_FILE=fifo)
got = b""
try:
    while chunk := os.read(reader, 1 << 16):
        got += chunk
except BlockingIOError:
    pass
os.close(reader)
check(os.path.exists(fifo) and not os.path.isfile(fifo), "the FIFO is left a FIFO")
check(got.startswith(b"{") and b'"pools"' in got, f"the stats came through the FIFO: {got[:200]!r}")

to_stdout = path("stdout.json")
os.symlink("/proc/self/fd/1", to_stdout)  # ours, as /dev/stdout is root's
p = shim_run("stats-stdout", BFCSHIM_STATS_FILE=to_stdout)
check(os.path.islink(to_stdout), "a link of our own to stdout is left a link")
check('"pools"' in p.stdout, f"the stats went to stdout: {p.stdout[-300:]!r}")

# 12. (audit of a5d1b3c) A link of our own whose target runs through a
# directory link another user planted: followed, the stats (and the log)
# went wherever that user chose. Every link on the way must be ours or the
# system's, not only the links of the chain's last components.
os.mkdir(path("victim-dir"))
v = victim("victim-dir/stats.json")
plant(path("victim-dir"), path("their-dir"))  # a directory link of theirs
own = path("own-into-theirs.json")
os.symlink(path("their-dir/stats.json"), own)  # ours
shim_run("stats-own-into-theirs", BFCSHIM_STATS_FILE=own)
untouched(v, "stats through our link into their directory link")
check(os.path.islink(own), "our link is left a link")

check.finish()
