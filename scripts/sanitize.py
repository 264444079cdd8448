#!/usr/bin/env python3
"""Runs the GPU test binary under compute-sanitizer's four tools and fails on anything they report.

Each (tool, test) pair is its own process (`<binary> --include-ignored --exact <test>`), so one test that a tool
cannot host or that dies under it is named as such and the others still run; pairs run in parallel (`-j`),
since the tools' cost is mostly host-side instrumentation. The tools:

  memcheck   out-of-bounds and misaligned device accesses, invalid frees, CUDA API errors
  racecheck  shared-memory hazards, with `--racecheck-report all` (warp-level hazards included)
  initcheck  device reads of global memory nothing wrote
  synccheck  barriers some threads of a block or warp never reach, invalid sync masks

A pair is clean when the test passes under the tool, the tool printed its summary line (no abort, no timeout)
and every record it reported matches an entry of the allow-list for that tool (`scripts/sanitize-allow.txt`:
`tool | regex | why`, each entry a documented, understood false positive). The last lines printed are one
summary line per tool; the exit status is 0 only if every pair is clean.

Usage (on the GPU host; stdlib only):
  scripts/sanitize.py [--binary carry/gpu] [--tools memcheck,racecheck,initcheck,synccheck] [-j 12]
                      [--timeout 420] [--deadline SECONDS] [--logs DIR] [--filter SUBSTRING]...
                      [--expect-caught]

`CARRY_PLANTED=1 scripts/carry.sh` also builds carry/gpu-plant-<bug> with each bug of build.rs's MOE_GEMM_PLANT;
`--expect-caught` turns the check around for them: every selected pair must report the bug.

Host memory: racecheck runs with blocking launches (see TOOLS). A pair killed by SIGKILL (the kernel's OOM killer
while other pairs hold memory too) is run again alone after the others and judged by that run; the kernel log's
OOM lines are printed. Each pair's peak RSS is in its log and on its line.
"""

import argparse
import concurrent.futures as cf
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TOOLS = {
    "memcheck": ["--tool", "memcheck"],
    # Blocking launches: racecheck analyses each launch on the host, and launches queued ahead of that analysis
    # (a layer's chain of kernels) held up to 130.8 GB of host RSS and met the OOM killer; one launch at a time,
    # the layer tests that died so peak at 2.6 GB (benches/results/h100-2026-12-06-gpu-fec839d). A graph launch is
    # one launch: the 58-layer Grouped graph test still passes 128 GiB (allow-list: `exclude`). Shared-memory
    # hazards live within one block, so serialising kernels hides none.
    "racecheck": ["--tool", "racecheck", "--racecheck-report", "all", "--force-blocking-launches"],
    "initcheck": ["--tool", "initcheck"],
    "synccheck": ["--tool", "synccheck"],
}
# A record: a line the tool starts flush after its prefix (the indented lines below it belong to it).
PREFIX = "========= "
SUMMARY = re.compile(r"^========= (ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\))")
TEST_OK = re.compile(r"^test result: ok\. 1 passed")


def read_allow(path):
    """The allow-list: report entries `tool | regex | why`, and kernel exclusions
    `exclude | tool | test | kernel filter | why` (a test the tool cannot host with every kernel instrumented: the
    filter, compute-sanitizer's `--kernel-name-exclude` syntax, leaves those kernels out in that test only)."""
    allow, exclude = [], {}
    if not path.exists():
        return allow, exclude
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("exclude"):
            parts = [p.strip() for p in line.split("|", 4)]
            if len(parts) != 5 or parts[1] not in TOOLS or not parts[2] or not parts[3] or not parts[4]:
                sys.exit(f"{path}:{n}: an exclusion is `exclude | tool | test | kernel filter | why`")
            exclude[(parts[1], parts[2])] = parts[3]
            continue
        parts = [p.strip() for p in line.split("|", 2)]
        if len(parts) != 3 or parts[0] not in TOOLS or not parts[2]:
            sys.exit(f"{path}:{n}: an entry is `tool | regex | why` with a tool of {sorted(TOOLS)} and a reason")
        allow.append((parts[0], re.compile(parts[1]), parts[2]))
    return allow, exclude


def records(log):
    """The tool's reports in `log`, each with its indented detail lines joined."""
    out, cur = [], None
    for line in log.splitlines():
        at = line.find(PREFIX.rstrip())
        if at < 0:
            continue
        line = line[at:]  # the tool's lines can follow the test's output on one line
        body = line[len(PREFIX):] if line.startswith(PREFIX) else ""
        if not body.strip():
            continue
        if body.startswith(" "):
            if cur is not None:
                cur.append(body.strip())
            continue
        if SUMMARY.match(line) or body.startswith("COMPUTE-SANITIZER"):
            cur = None
            continue
        cur = [body.strip()]
        out.append(cur)
    return [" | ".join(r) for r in out]


def log_name(test):
    return test.replace("::", "__") + ".log"  # no colons: some copy tools refuse them


def run_one(binary, tool, test, timeout, stop_at, logs, exclude=None):
    """Runs one pair; returns (tool, test, rc, seconds, output, peak host RSS in GB of the tool's process tree)."""
    skip = ["--kernel-name-exclude", exclude] if exclude else []
    cmd = ["compute-sanitizer", *TOOLS[tool], *skip, "--print-limit", "200", "--show-backtrace", "yes",
           binary, "--include-ignored", "--exact", test, "--test-threads=1", "--nocapture"]
    env = dict(os.environ, RUST_BACKTRACE="1")
    t0 = time.time()
    limit = min(timeout, stop_at - t0)
    if limit < 1:
        return tool, test, "deadline", 0.0, "", 0.0
    # Its own process group, so that a timeout ends the tool and the test process it started; reaped by wait4,
    # whose rusage gives the peak RSS of the tool and the test process (racecheck's can reach the host's size).
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(p.stdout.read()))
    reader.start()
    timed_out = False
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.time() - t0 > limit:
            os.killpg(p.pid, signal.SIGKILL)
            pid, status, ru = os.wait4(p.pid, 0)
            timed_out = True
            break
        time.sleep(0.25)
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    reader.join()
    text = b"".join(chunks).decode(errors="replace")
    rc = None if timed_out else p.returncode
    if timed_out:
        text += f"\n[sanitize.py] timed out after {limit:.0f} s\n"
    secs, rss = time.time() - t0, ru.ru_maxrss / 1e6
    (logs / tool).mkdir(parents=True, exist_ok=True)
    (logs / tool / log_name(test)).write_text(
        f"$ {' '.join(cmd)}\n[sanitize.py] rc {rc}, {secs:.1f} s, peak RSS {rss:.1f} GB\n{text}")
    return tool, test, rc, secs, text, rss


def oom_kills():
    """The kernel log's OOM-killer lines (empty where the log cannot be read)."""
    r = subprocess.run(["dmesg"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return [l for l in r.stdout.decode(errors="replace").splitlines() if "Killed process" in l or "Out of memory" in l]


PAIR_LINE = re.compile(r"^\[(\w+)\] (\S+) \(([0-9.]+) s")


def earlier_seconds(paths):
    """(tool, test) -> the longest time one pair took in earlier outputs of this script."""
    took = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            m = PAIR_LINE.match(line)
            if m:
                key = (m.group(1), m.group(2))
                took[key] = max(took.get(key, 0.0), float(m.group(3)))
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(__file__).resolve().parent
    ap.add_argument("--binary", default="carry/gpu")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("-j", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=420, help="seconds one (tool, test) pair may run")
    ap.add_argument("--deadline", type=float, default=float("inf"),
                    help="seconds for the whole run: pairs not started by then are reported as not run, so the "
                    "summary is printed inside a lease's limit")
    ap.add_argument("--logs", default="sanitize-logs")
    ap.add_argument("--allow", default=str(here / "sanitize-allow.txt"))
    ap.add_argument("--filter", action="append", default=[], help="run only tests containing one of these")
    ap.add_argument("--longest-first", action="append", default=[], metavar="EARLIER_OUTPUT",
                    help="start the pairs that took longest in these earlier outputs of this script first, so "
                    "that a --deadline does not find a long pair unstarted")
    ap.add_argument("--expect-caught", action="store_true",
                    help="for a build with a planted bug (MOE_GEMM_PLANT): succeed only if every pair reports it")
    a = ap.parse_args()
    tools = a.tools.split(",")
    for t in tools:
        if t not in TOOLS:
            sys.exit(f"unknown tool {t}: one of {sorted(TOOLS)}")
    allow, exclude = read_allow(Path(a.allow))
    listing = subprocess.run([a.binary, "--include-ignored", "--list"], stdout=subprocess.PIPE, check=True)
    tests = [l[: -len(": test")] for l in listing.stdout.decode().splitlines() if l.endswith(": test")]
    if a.filter:
        tests = [t for t in tests if any(f in t for f in a.filter)]
    if not tests:
        sys.exit("no tests selected")
    logs = Path(a.logs)
    jobs = [(tool, test) for test in tests for tool in tools]
    if a.longest_first:
        took = earlier_seconds(a.longest_first)
        jobs.sort(key=lambda j: -took.get(j, 0.0))  # stable: unknown pairs keep their order, after the known
    results = {t: [] for t in tools}
    oom_before = len(oom_kills())

    def judge(tool, test, rc, secs, text, rss, note=""):
        recs = records(text)
        bad = [r for r in recs if not any(t == tool and rx.search(r) for t, rx, _ in allow)]
        summary = [m for m in map(SUMMARY.match, text.splitlines()) if m]
        passed = any(TEST_OK.match(l) for l in text.splitlines())
        problem = None
        if rc == "deadline":
            problem = "not run: the --deadline passed first"
        elif rc is None:
            problem = "timed out"
        elif "process didn't terminate successfully" in text:
            problem = f"the test process died under the tool (rc {rc}), before any test result"
        elif not summary:
            problem = f"no {tool} summary (the process died: rc {rc})"
        elif not passed:
            problem = f"the test failed (rc {rc})"
        elif bad:
            problem = f"{len(bad)} report(s): {bad[0][:300]}"
        results[tool].append((test, problem, len(recs) - len(bad), secs, rss))
        if (tool, test) in exclude:
            note += f" [kernels left out: {exclude[(tool, test)]}]"
        state = "ok" if problem is None else f"FAIL: {problem}"
        print(f"[{tool}] {test} ({secs:.0f} s, {rss:.1f} GB){note}: {state}", flush=True)

    killed = []
    with cf.ThreadPoolExecutor(max_workers=a.j) as ex:
        stop_at = time.time() + a.deadline
        futs = [
            ex.submit(run_one, a.binary, tool, test, a.timeout, stop_at, logs, exclude.get((tool, test)))
            for tool, test in jobs
        ]
        for f in cf.as_completed(futs):
            tool, test, rc, secs, text, rss = f.result()
            # compute-sanitizer exits 9 when the test process it started was killed by SIGKILL.
            if rc == -signal.SIGKILL or (rc == 9 and "process didn't terminate successfully" in text):
                # Not our timeout (that gives rc None): the host killed the tool's process tree, in practice
                # the OOM killer while other pairs held memory too. Judged by a run alone, after the others.
                print(f"[{tool}] {test} ({secs:.0f} s, {rss:.1f} GB): killed (SIGKILL) beside other pairs; "
                      "run again alone at the end", flush=True)
                killed.append((tool, test))
                continue
            judge(tool, test, rc, secs, text, rss)
    kills = oom_kills()[oom_before:]
    for line in kills:
        print(f"kernel log: {line.strip()}")
    for tool, test in killed:
        judge(*run_one(a.binary, tool, test, a.timeout, stop_at, logs, exclude.get((tool, test))), note=" [alone]")
    clean = True
    print()
    for tool in tools:
        rs = results[tool]
        allowed = sum(r[2] for r in rs)
        names = sorted({r[0] for r in rs})
        failed = [r for r in rs if r[1] is not None]
        failed_tests = [r[0] for r in failed]
        if a.expect_caught:
            # A planted bug is caught when some run of the test reports it.
            caught = {r[0] for r in rs if r[1] is not None and "report" in r[1]}
            missed = [t for t in names if t not in caught]
            clean &= not missed
            for test in missed:
                print(f"{tool}: {test}: the planted bug was NOT caught")
            print(f"{tool:<9} planted bug caught in {len(names) - len(missed)}/{len(names)} tests")
            continue
        clean &= not failed
        for test, problem, _, _, _ in sorted(failed):
            print(f"{tool}: {test}: {problem}")
        print(f"{tool:<9} {len(names) - len(failed_tests)}/{len(names)} tests clean, {len(failed_tests)} not; "
              f"{allowed} allow-listed reports; {sum((tool, n) in exclude for n in names)} with kernels left out; longest {max(r[3] for r in rs):.0f} s, "
              f"peak RSS {max(r[4] for r in rs):.0f} GB")
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()
