# ruff: noqa
import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from indep import *
from collections import Counter
p=sys.argv[1]; d=load(p); ev=X(d)
kern=[e for e in ev if e.get('cat') in ('kernel','Kernel')]
ktot=sum(k['dur'] for k in kern)
enc=enclosing_ops(ev)
def dims(o): return [s for s in (o.get('args',{}).get('Input Dims') or []) if isinstance(s,list)]
# T values from softmax on [...,T,T]
Ts=Counter()
for e in ev:
    if e.get('cat')=='cpu_op' and e['name'] in ('aten::softmax','aten::_softmax','aten::_safe_softmax'):
        s=dims(e)[0] if dims(e) else []
        if len(s)>=2 and s[-1]==s[-2] and s[-1]>=16: Ts[s[-1]]+=1
print('softmax T',Ts)
T=Ts.most_common(1)[0][0]
MM=('aten::bmm','aten::baddbmm','aten::matmul')
def is_att(o):
    ds=dims(o)
    if o['name'] in ('aten::softmax','aten::_softmax','aten::_safe_softmax'):
        return bool(ds) and ds[0][-2:]==[T,T]
    if o['name'] in MM:
        if any(s[-2:]==[T,T] for s in ds): return True   # P@V (or baddbmm bias)
        mats=[s for s in ds if len(s)>=2]
        if len(mats)>=2 and mats[-2][-2]==T and mats[-1][-1]==T: return True  # Q@K^T
        if o['name']=='aten::baddbmm' and len(mats)>=3 and mats[1][-2]==T and mats[2][-1]==T: return True
    return False
tot=0;n=0;by=Counter();calls=Counter();seen=set()
for k in kern:
    ops=enc.get(k.get('args',{}).get('correlation'),[])
    hit=[o for o in ops if is_att(o)]
    if hit:
        tot+=k['dur'];n+=1;by[(hit[0]['name'],k['name'][:70])]+=k['dur']
        for o in hit[:1]:
            if id(o) not in seen: seen.add(id(o)); calls[o['name']]+=1
print('T',T,'kernels',n,'ms',tot/1e3,'of',ktot/1e3,'=',tot/ktot, 'top-level att ops',calls)
for k,v in by.most_common(10): print(' ',round(v/1e3,3),k)
