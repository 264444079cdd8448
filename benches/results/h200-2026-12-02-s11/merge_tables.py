"""Merges re-tuned buckets (the files `moe-gemm tune` wrote into TUNED) into copies of the shipped tables
(SHIPPED, `configs/h200/`), written to OUT (OUT may be SHIPPED itself); the buckets TUNED lacks are kept.
Usage: merge_tables.py TUNED SHIPPED OUT"""
import glob
import json
import os
import sys

tuned, shipped, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
for f in sorted(glob.glob(os.path.join(shipped, "*.json"))):
    name = os.path.basename(f)
    table = json.load(open(f))
    new_path = os.path.join(tuned, name)
    if os.path.exists(new_path):
        for bucket, entry in json.load(open(new_path)).items():
            before = table.get(bucket, {}).get("backend")
            table[bucket] = entry
            print(f"{name.split(',device')[0]} T={bucket}: {before} -> {entry['backend']}")
    with open(os.path.join(out, name), "w") as o:
        json.dump(table, o, indent=2, sort_keys=True)
        o.write("\n")
