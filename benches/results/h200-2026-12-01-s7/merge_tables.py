"""Merges this session's decode buckets (T = 1 ... 256, re-tuned after the SwapAb gated epilogue and K-split rule,
`tuned-decode/`) into the shipped tables (`configs/h200/`), keeping the prefill buckets (T >= 512,
whose backends the new tile does not run). Run from the repository root."""
import glob
import json
import os

for f in sorted(glob.glob("benches/results/h200-2026-12-01-s7/tuned-decode/*.json")):
    shipped = os.path.join("configs/h200", os.path.basename(f))
    table = json.load(open(shipped))
    new = json.load(open(f))
    for bucket, entry in new.items():
        before = table.get(bucket, {}).get("backend")
        table[bucket] = entry
        print(f"{os.path.basename(f).split(',device')[0]} T={bucket}: {before} -> {entry['backend']}")
    with open(shipped, "w") as out:
        json.dump(table, out, indent=2, sort_keys=True)
        out.write("\n")
