# ruff: noqa
import sqlite3, sys, re
from collections import defaultdict
p=sys.argv[1]
c=sqlite3.connect(f'file:{p}?mode=ro',uri=True); c.text_factory=lambda b:b.decode('utf-8','replace')
tabs={r[0] for r in c.execute("select name from sqlite_master where type='table'")}
iv=[]
for t in ('CUPTI_ACTIVITY_KIND_KERNEL','CUPTI_ACTIVITY_KIND_MEMCPY','CUPTI_ACTIVITY_KIND_MEMSET'):
    if t in tabs: iv+= [list(r) for r in c.execute(f'select start,end from {t}')]
iv.sort(); u=[]
for s,e in iv:
    if u and s<=u[-1][1]: u[-1][1]=max(u[-1][1],e)
    else: u.append([s,e])
lo,hi=u[0][0],u[-1][1]
gaps=[[u[i][1],u[i+1][0]] for i in range(len(u)-1) if u[i+1][0]>u[i][1]]
idle=sum(e-s for s,e in gaps)
rt=[(n,s,e) for n,s,e in c.execute('select s.value,r.start,r.end from CUPTI_ACTIVITY_KIND_RUNTIME r join StringIds s on s.id=r.nameId')]
def ov(calls):
    cs=sorted([[s,e] for _,s,e in calls]); m=[]
    for s,e in cs:
        if m and s<=m[-1][1]: m[-1][1]=max(m[-1][1],e)
        else: m.append([s,e])
    t=0
    for a,b in m:
        for g0,g1 in gaps:
            x=min(b,g1)-max(a,g0)
            if x>0: t+=x
    return t
groups={'sync':r'Synchronize','alloc':r'Malloc|Free|HostAlloc|HostRegister','setup':r'StreamCreate|StreamDestroy|EventCreate|EventDestroy|Module|GetProcAddress','launch':r'Launch','memcpy':r'Memcpy'}
print('window ms',(hi-lo)/1e6,'idle ms',idle/1e6)
for g,rx in groups.items():
    cs=[x for x in rt if re.search(rx,x[0])]
    print(g, len(cs),'calls', round(sum(e-s for _,s,e in cs)/1e6,3),'ms total; overlap with idle', round(ov(cs)/1e6,3))
allc=ov(rt); print('any runtime call over idle', round(allc/1e6,3))
per=defaultdict(float)
for n,s,e in rt:
    for g0,g1 in gaps:
        x=min(e,g1)-max(s,g0)
        if x>0: per[n]+=x
print(sorted([(round(v/1e6,3),k) for k,v in per.items()],reverse=True)[:10])
