# ruff: noqa
import sys; sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from indep import *
from collections import Counter
p=sys.argv[1]; T=int(sys.argv[2]); d=load(p); ev=X(d)
kern=[e for e in ev if e.get('cat') in ('kernel','Kernel')]
enc=enclosing_ops(ev)
def dims(o): return [s for s in (o.get('args',{}).get('Input Dims') or []) if isinstance(s,list)]
by=Counter(); cnt=Counter(); tot=0; n=0
for k in kern:
    ops=enc.get(k.get('args',{}).get('correlation'),[])
    hit=[o for o in ops if any(len(s)>=2 and s[-2:]==[T,T] for s in dims(o))]
    if hit:
        o=hit[-1]  # innermost
        key=(o['name'], str(dims(o))[:80]); by[key]+=k['dur']; cnt[key]+=1; tot+=k['dur']; n+=1
print('kernels under any op with a [..,T,T] input:',n, round(tot/1e3,3),'ms')
for k,v in by.most_common(20): print(' ',round(v/1e3,3),cnt[k],k)
