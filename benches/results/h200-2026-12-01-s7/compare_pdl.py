import re,math,sys
def load(f):
    d={}
    for l in open(f):
        m=re.match(r'^(\S+/T=\d+)\s+(Fused)\s+(\S+)\s+([\d.]+)',l)
        if m: d[m.group(1)]=float(m.group(4))
    return d
o=sys.argv[1]
p=[load(f'{o}/prev-1.log'),load(f'{o}/prev-2.log')]; n=[load(f'{o}/pdl-1.log'),load(f'{o}/pdl-2.log')]
g=[]
for k in p[0]:
    a=min(p[0][k],p[1][k]); b=min(n[0][k],n[1][k]); g.append(b/a)
    print('%-24s %8.1f %8.1f %.3f'%(k,a,b,b/a))
gm=math.exp(sum(map(math.log,g))/len(g))
print('geomean %.4f worst %.3f best %.3f'%(gm,max(g),min(g)))
print('PDL' if gm < 0.999 and max(g) < 1.01 else 'NOPDL')
