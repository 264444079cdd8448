import re,math
def parse(fs):
    d={}
    for f in fs:
        for l in open(f):
            m=re.match(r'^(\S+/T=\S+)\s+Auto\s+(\S+)\s+([\d.]+)\s',l)
            if m: d.setdefault(m.group(1),[]).append(float(m.group(3)))
    return {k:min(v) for k,v in d.items()}
S={'cost':parse(['auto-cost-model-1.log','/work/.device/2/cost-2.log']),'uniform-tuned':parse(['auto-uniform-tables-1.log','auto-uniform-tables-2.log']),'robust':parse(['auto-robust-tables-1.log','auto-robust-tables-2.log'])}
keys=[k for k in S['cost'] if all(k in s for s in S.values())]
best={k:min(s[k] for s in S.values()) for k in keys}
for n,s in S.items():
    r=[s[k]/best[k] for k in keys]
    print(f"{n:14s} geomean vs best-of-3 {math.exp(sum(map(math.log,r))/len(r)):.4f}  worst {max(r):.3f}  within 3% of best: {sum(x<1.03 for x in r)}/{len(r)}")
