# Merges the buckets of freshly tuned files (`moe-gemm tune --tokens ...`: files holding only those buckets) into
# the shipped tables, in the shipped files' own format. Usage: python3 merge_tuned.py SHIPPED_DIR TUNED_DIR OUT_DIR
import json, os, shutil, sys
shipped, tuned, out = sys.argv[1:4]
if os.path.abspath(out) != os.path.abspath(shipped):
    shutil.copytree(shipped, out, dirs_exist_ok=True)
for f in sorted(os.listdir(tuned)):
    if not f.endswith('.json'):
        continue
    d = json.load(open(os.path.join(out, f)))
    for k, v in json.load(open(os.path.join(tuned, f))).items():
        old = d.get(k, {})
        print(f"{f} bucket {k}: {old.get('backend')}/{old.get('fused_tile')} -> {v.get('backend')}/{v.get('fused_tile')}")
        d[k] = v
    d = dict(sorted(d.items()))  # as the writer orders them: keys as strings
    open(os.path.join(out, f), 'w').write(json.dumps(d, indent=2) + '\n')
