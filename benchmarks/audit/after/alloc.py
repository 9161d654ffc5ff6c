# ruff: noqa
import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from indep import *
import re
ALLOC=re.compile(r'^(cuda|hip)(Malloc|Free|MallocAsync|FreeAsync|MallocHost|FreeHost|HostAlloc|HostFree|ExtMallocWithFlags)(_v\d+)?$')
p=sys.argv[1]; d=load(p); ev=X(d)
gpu=[e for e in ev if e.get('cat') in ('kernel','gpu_memcpy','gpu_memset')]
rt=[e for e in ev if e.get('cat') in ('cuda_runtime','cuda_driver')]
iv=sorted([[e['ts'],e['ts']+e['dur']] for e in gpu]); u=[]
for s,e in iv:
    if u and s<=u[-1][1]: u[-1][1]=max(u[-1][1],e)
    else: u.append([s,e])
lo,hi=u[0][0],u[-1][1]
gaps=[[u[i][1],u[i+1][0]] for i in range(len(u)-1) if u[i+1][0]>u[i][1]]
al=[e for e in rt if ALLOC.search(e['name'])]
inw=[e for e in al if e['ts']<hi and e['ts']+e['dur']>lo]
m=[]
for s,e in sorted([[c['ts'],c['ts']+c['dur']] for c in inw]):
    if m and s<=m[-1][1]: m[-1][1]=max(m[-1][1],e)
    else: m.append([s,e])
ov=sum(max(0,min(e,g1)-max(s,g0)) for s,e in m for g0,g1 in gaps)
from collections import Counter
print(Counter(e['name'] for e in al), 'in window',len(inw),'host ms',round(sum(min(e['ts']+e['dur'],hi)-max(e['ts'],lo) for e in inw)/1e3,3),'full ms',round(sum(e['dur'] for e in inw)/1e3,3),'overlap idle ms',round(ov/1e3,3),'idle',round(sum(g1-g0 for g0,g1 in gaps)/1e3,3),'window',round((hi-lo)/1e3,3))
