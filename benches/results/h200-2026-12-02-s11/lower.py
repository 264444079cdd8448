"""Lower median per row key (model, tokens, routing, backend, ran) over several suite CSVs, written as one CSV
(the same columns; p10/p90 and ratios of the run that gave the lower median). Usage: lower.py OUT IN..."""
import csv, sys

out, ins = sys.argv[1], sys.argv[2:]
best, cols = {}, None
for path in ins:
    with open(path) as f:
        r = csv.DictReader(f)
        cols = r.fieldnames
        for row in r:
            key = (row["model"], row["tokens"], row["routing"], row["backend"], row["ran"])
            if not row["median_us"]:
                best.setdefault(key, row)
                continue
            old = best.get(key)
            if old is None or not old["median_us"] or float(row["median_us"]) < float(old["median_us"]):
                best[key] = row
with open(out, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    w.writerows(best.values())
