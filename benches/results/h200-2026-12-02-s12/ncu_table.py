# Per-kernel table of an `ncu --metrics ... --csv` log: kernel (shortened), duration us, DRAM % of peak, GB read,
# grid, registers. Usage: python3 ncu_table.py LOG...
import csv, sys, collections
for f in sys.argv[1:]:
    rows = [l for l in open(f) if l.startswith('"')]
    r = list(csv.reader(rows))
    h = r[0]
    ki, mi, vi, ii = h.index('Kernel Name'), h.index('Metric Name'), h.index('Metric Value'), h.index('ID')
    d = collections.OrderedDict()
    for x in r[1:]:
        d.setdefault(x[ii], {'k': x[ki]})[x[mi]] = x[vi].replace(',', '')
    print(f)
    for i, v in d.items():
        if v['k'].startswith('spin_kernel'):
            continue
        k = v['k'].split('(')[0][-50:] if 'cutlass' not in v['k'] else 'cutlass ' + v['k'][:40]
        dur = float(v.get('gpu__time_duration.sum', 0)) / 1000
        gb = float(v.get('dram__bytes_read.sum', 0)) / 1e9
        print(f"  {i:>4} {k:<52} {dur:8.1f} us  dram {v.get('dram__throughput.avg.pct_of_peak_sustained_elapsed'):>6}%  {gb:6.3f} GB  grid {v.get('launch__grid_size'):>6} regs {v.get('launch__registers_per_thread')}")
