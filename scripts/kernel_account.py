#!/usr/bin/env python3
"""Per-kernel account of the layer's forward from Nsight Compute: each kernel's time, its DRAM traffic and
throughput and its tensor pipes' activity, per forward that `moe-gemm bench --layer` timed. This is the measured
account that a point missing its target owes (issues 35 and 38: which kernel holds the time, and is it at the
DRAM or the tensor-core limit).

On the GPU host, one point per process (the bench's timed replays each follow its 200 µs spin kernel, which is
how forwards are told apart here; the 3 untimed warm-up replays are not counted):

    ncu --csv --print-units base --log-file ncu.csv --clock-control none --metrics \\
      gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
    dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,\\
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\\
    sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \\
      ./moe-gemm bench --layer --dtype fp8 --quant-only --backends grouped --no-ceilings --peer none \\
      --models qwen3-30b-a3b --layer-tokens 4096 --routing uniform --reps 3
    python3 scripts/kernel_account.py ncu.csv [--md]

ncu replays each kernel alone, with caches flushed (its default `--cache-control all`), so the kernels' times add
up to the chain without overlap between kernels (no programmatic dependent launch): an account of where the time
goes, not the graph's time. `--clock-control none` keeps the clocks the bench runs at (ncu's default locks the
SM clock at base). mma.sync kernels count on the HMMA pipe, wgmma ones on the GMMA pipe.

    python3 scripts/kernel_account.py --self-test
"""
import csv
import io
import re
import statistics
import sys

METRICS = {
    "gpu__time_duration.sum": "time",
    "dram__bytes_read.sum": "read",
    "dram__bytes_write.sum": "write",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "hmma_pct",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "gmma_pct",
}
# To seconds and bytes, whatever units ncu printed (base units with --print-units base; scaled ones otherwise).
UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3,
         "s": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
         "KiB": 1024.0, "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3, "%": 1.0, "": 1.0}
SPIN = "spin_kernel"


def short_name(name):
    """The kernel's function name without namespaces, templates and arguments; a CUTLASS `device_kernel` keeps
    its kernel schedule (`...Kernel<schedule>...`) so that its configurations are told apart."""
    base, depth, out = name.split("(")[0], 0, []
    for ch in base:  # drop template arguments
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">"
    words = "".join(out).split()  # "void ns::fn": the last word, its last path segment
    fn = words[-1].split("::")[-1] if words else base
    if fn == "device_kernel":
        sched = re.findall(r"Kernel(?:PtrArray)?\w*?(?:Cooperative|Pingpong)\w*", name)
        if sched:
            fn += "[" + sched[0] + "]"
    return fn


def parse(text):
    """Kernel launches in order: dicts of name, grid, block and the metrics (seconds, bytes, percent)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]  # ncu's own ==PROF== lines are not CSV
    launches = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        key = r.get("Metric Name")
        if key not in METRICS:
            continue
        unit = (r.get("Metric Unit") or "").strip()
        if unit not in UNITS:
            sys.exit(f"kernel_account: unknown unit {unit!r} of {key}")
        raw = (r.get("Metric Value") or "").replace(",", "").strip()
        try:
            value = float(raw) * UNITS[unit]
        except ValueError:
            continue  # "n/a": a metric this kernel has not
        k = launches.setdefault(int(r["ID"]), {"name": r["Kernel Name"], "grid": r.get("Grid Size", ""),
                                               "block": r.get("Block Size", "")})
        k[METRICS[key]] = value
    return [launches[i] for i in sorted(launches)]


def forwards(launches):
    """The timed forwards: the launches between one spin kernel and the next. The last forward of a
    configuration runs on into the next one's set-up and warm-up: it is cut to the length of the forward before
    it, with which it must begin (a forward that matches neither neighbour is dropped: run --reps 2 or more)."""
    segs, cur = [], None
    for k in launches:
        if SPIN in k["name"]:
            if cur is not None:
                segs.append(cur)
            cur = []
        elif cur is not None:
            cur.append(k)
    if cur is not None:
        segs.append(cur)
    names = [[short_name(k["name"]) + k["grid"] for k in s] for s in segs]
    out = []
    for i, s in enumerate(segs):
        prev = names[i - 1] if i > 0 else None
        nxt = names[i + 1] if i + 1 < len(segs) else None
        if names[i] in (prev, nxt) or (nxt and nxt[: len(names[i])] == names[i]):
            out.append(s)
        elif prev and names[i][: len(prev)] == prev:
            out.append(s[: len(prev)])
    return out


def account(launches):
    """Per distinct forward (its kernel sequence), in order of first appearance: its repeats and, per kernel,
    the medians of its metrics over them."""
    groups = {}
    for f in forwards(launches):
        sig = tuple(short_name(k["name"]) + " " + k["grid"] for k in f)
        groups.setdefault(sig, []).append(f)
    result = []
    for sig, fs in groups.items():
        rows = []
        for j in range(len(sig)):
            ks = [f[j] for f in fs]

            def med(key):
                vals = [k[key] for k in ks if key in k]
                return statistics.median(vals) if vals else None

            rows.append({"kernel": short_name(ks[0]["name"]), "grid": ks[0]["grid"], "block": ks[0]["block"],
                         **{m: med(m) for m in METRICS.values()}})
        result.append((len(fs), rows))
    return result


def render(result, md):
    head = ["#", "kernel", "grid", "block", "µs", "share", "DRAM GB", "TB/s", "DRAM %", "SM %", "HMMA %", "GMMA %"]
    out = []
    for n, (repeats, rows) in enumerate(result):
        total = sum(r["time"] or 0 for r in rows)
        out.append(f"forward {n + 1}: {len(rows)} kernels, {total * 1e6:.1f} µs in all (sum of the kernels' "
                   f"medians over {repeats} timed forwards)")
        table = []
        for j, r in enumerate(rows):
            t, gb = r["time"], ((r["read"] or 0) + (r["write"] or 0)) / 1e9

            def pct(v):
                return "-" if v is None else f"{v:.1f}"

            table.append([str(j + 1), r["kernel"], r["grid"], r["block"], "-" if t is None else f"{t * 1e6:.1f}",
                          "-" if not t or not total else f"{t / total:.2f}", f"{gb:.3f}",
                          "-" if not t else f"{gb / 1e3 / t:.2f}", pct(r["dram_pct"]), pct(r["sm_pct"]),
                          pct(r["hmma_pct"]), pct(r["gmma_pct"])])
        if md:
            out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            out += ["| " + " | ".join(row) + " |" for row in table]
        else:
            widths = [max(len(x) for x in col) for col in zip(head, *table)]
            for row in [head] + table:
                out.append("  ".join(x.rjust(w) if i not in (1, 2, 3) else x.ljust(w)
                                     for i, (x, w) in enumerate(zip(row, widths))))
        out.append("")
    return "\n".join(out)


def self_test():
    """Two configurations of 2 timed forwards each, in ncu's CSV with scaled units and a thousands separator."""
    hdr = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    rows, ident = [hdr], 0

    def launch(name, grid, us, dram_gb, dram_pct):
        nonlocal ident
        base = f'"{ident}","1","moe-gemm","h","{name}","1","7","(128, 1, 1)","{grid}","0","9.0","Command line profiler metrics"'
        rows.extend([base + f',"gpu__time_duration.sum","usecond","{us:,.2f}"',
                     base + f',"dram__bytes_read.sum","Mbyte","{dram_gb * 1e3:,.1f}"',
                     base + ',"dram__bytes_write.sum","byte","0"',
                     base + f',"dram__throughput.avg.pct_of_peak_sustained_elapsed","%","{dram_pct}"',
                     base + ',"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","%","n/a"'])
        ident += 1

    spin = "moe_gemm::runtime_detail::spin_kernel(unsigned long)"
    gemm = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::" \
           "KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise, int>>(T1::Params)"
    quant = "void moe_gemm::quant::quantize_gather_kernel<__nv_bfloat16>(int, const float *)"
    launch("void fill_kernel(float *)", "(64, 1, 1)", 5, 0.1, 10)  # set-up before any spin: not counted
    for _ in range(3):  # warm-up
        launch(quant, "(32, 1, 1)", 9, 0.01, 20)
    for t in (1000.0, 1200.0):  # configuration A: quantise, GEMM
        launch(spin, "(1, 1, 1)", 200, 0, 0)
        launch(quant, "(32, 1, 1)", 10, 0.02, 30)
        launch(gemm, "(132, 1, 1)", t, 3.0, 80)
    launch("void fill_kernel(float *)", "(64, 1, 1)", 5, 0.1, 10)  # B's set-up and warm-up, after A's last
    launch(gemm, "(66, 1, 1)", 1, 0.0, 1)
    for t in (500.0, 700.0):  # configuration B: the GEMM alone, another grid
        launch(spin, "(1, 1, 1)", 200, 0, 0)
        launch(gemm, "(66, 1, 1)", t, 1.0, 60)
    res = account(parse("==PROF== Connected to process 1\n" + "\n".join(rows)))
    assert [(n, [r["kernel"] for r in rs]) for n, rs in res] == [
        (2, ["quantize_gather_kernel", "device_kernel[KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise]"]),
        (2, ["device_kernel[KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise]"]),
    ], res
    a_gemm = res[0][1][1]
    assert abs(a_gemm["time"] - 1100e-6) < 1e-12 and abs(a_gemm["read"] - 3.0e9) < 1 and a_gemm["gmma_pct"] is None
    assert abs(res[1][1][0]["time"] - 600e-6) < 1e-12
    text = render(res, md=False)
    assert "1110.0 µs in all" in text and "600.0 µs in all" in text, text
    # Another ncu version's columns (a "Kernel Time", no block or grid), short units and an "n/a" value.
    other = [
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream",'
        '"Section Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","b","h","spin_kernel(unsigned long)","t","1","7","m","gpu__time_duration.sum","us","200.00"',
        '"1","1","b","h","k(int)","t","1","7","m","gpu__time_duration.sum","us","1,234.50"',
        '"1","1","b","h","k(int)","t","1","7","m","dram__throughput.avg.pct_of_peak_sustained_elapsed","","n/a"',
        '"2","1","b","h","spin_kernel(unsigned long)","t","1","7","m","gpu__time_duration.sum","us","200.00"',
        '"3","1","b","h","k(int)","t","1","7","m","gpu__time_duration.sum","ms","1.00"',
    ]
    res = account(parse("\n".join(other)))
    assert len(res) == 1 and res[0][0] == 2 and abs(res[0][1][0]["time"] - 1117.25e-6) < 1e-12, res
    assert res[0][1][0]["dram_pct"] is None, res
    print("kernel_account self-test: ok")


def main():
    if "--self-test" in sys.argv:
        return self_test()
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(paths) != 1:
        sys.exit(__doc__)
    with open(paths[0]) as f:
        launches = parse(f.read())
    if not launches:
        sys.exit(f"kernel_account: no kernel metrics in {paths[0]} (ncu --csv --log-file ... --metrics ...)")
    result = account(launches)
    if not result:
        sys.exit(f"kernel_account: {len(launches)} kernels but no forward between the bench's spin kernels")
    print(render(result, "--md" in sys.argv))


if __name__ == "__main__":
    main()
