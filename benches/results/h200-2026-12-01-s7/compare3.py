import re,math,sys
def load(f):
    d={}
    for l in open(f):
        m=re.match(r'^(\S+/T=\d+)\s+(Fused)\s+(\S+)\s+([\d.]+)',l)
        if m: d[m.group(1)]=float(m.group(4))
    return d
names=['main','gated','gated-split']
r={n:[load(f'{n}-1.log'),load(f'{n}-2.log')] for n in names}
best={n:{k:min(r[n][0][k],r[n][1][k]) for k in r[n][0]} for n in names}
print('%-22s %8s %8s %8s %7s %7s'%('point','main','gated','g+split','g/main','gs/g'))
g1=[];g2=[]
for k in best['main']:
    a,b,c=best['main'][k],best['gated'][k],best['gated-split'][k]
    g1.append(b/a);g2.append(c/b)
    print('%-22s %8.1f %8.1f %8.1f %7.3f %7.3f'%(k,a,b,c,b/a,c/b))
gm=lambda g: math.exp(sum(map(math.log,g))/len(g))
print('geomean gated/main',gm(g1),' gated+split/gated',gm(g2))
