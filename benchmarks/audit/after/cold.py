# ruff: noqa
import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from indep import *
import re
LAUNCH=re.compile(r'(cuda|hip)(LaunchKernel|ExtModuleLaunchKernel|ModuleLaunchKernel|LaunchCooperativeKernel)|cuLaunchKernel')
LOAD=re.compile(r'cuModuleLoad|cuLibraryLoad|hipModuleLoad')
p=sys.argv[1]; d=load(p); ev=X(d)
gpu=[e for e in ev if e.get('cat') in ('kernel','gpu_memcpy','gpu_memset')]
rt=sorted([e for e in ev if e.get('cat') in ('cuda_runtime','cuda_driver')],key=lambda e:e['ts'])
kname={e['args'].get('correlation'):e['name'] for e in gpu if e.get('cat')=='kernel'}
iv=sorted([[e['ts'],e['ts']+e['dur']] for e in gpu]); u=[]
for s,e in iv:
    if u and s<=u[-1][1]: u[-1][1]=max(u[-1][1],e)
    else: u.append([s,e])
lo,hi=u[0][0],u[-1][1]
gaps=[[u[i][1],u[i+1][0]] for i in range(len(u)-1) if u[i+1][0]>u[i][1]]
seen=set(); cold=[]
for e in rt:
    if LAUNCH.search(e['name']):
        k=kname.get(e['args'].get('correlation'))
        first = k is not None and k not in seen
        if k is not None: seen.add(k)
        if first and e['dur']>1000: cold.append(e)
    elif LOAD.search(e['name']): cold.append(e)
def ovl(a0,a1):
    return sum(max(0,min(a1,g1)-max(a0,g0)) for g0,g1 in gaps)
m=[]
for s,e in sorted([[c['ts'],c['ts']+c['dur']] for c in cold]):
    if m and s<=m[-1][1]: m[-1][1]=max(m[-1][1],e)
    else: m.append([s,e])
a=sum(ovl(s,e) for s,e in m)
b=sum(g1-g0 for g0,g1 in gaps if any(c['ts']<g1 and c['ts']+c['dur']>g0 for c in cold))
print(p.split('/')[-1],'cold calls',len(cold),'in window',sum(1 for c in cold if c['ts']+c['dur']>lo),'call ms',round(sum(c['dur'] for c in cold)/1e3,3),
 'overlap-with-idle ms',round(a/1e3,3),'gaps-containing ms',round(b/1e3,3),'idle ms',round(sum(g1-g0 for g0,g1 in gaps)/1e3,3))
