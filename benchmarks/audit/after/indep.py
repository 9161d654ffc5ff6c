# ruff: noqa
import gzip, json, re, bisect
from collections import defaultdict
def load(p):
    op = gzip.open if p.endswith('.gz') else open
    with op(p, 'rt', errors='replace') as f:
        d = json.load(f)
    return {'traceEvents': d} if isinstance(d, list) else d
def X(d):
    out=[]
    for e in d['traceEvents']:
        if isinstance(e, dict) and e.get('ph')=='X' and 'ts' in e and 'dur' in e:
            e['ts']=float(e['ts']); e['dur']=float(e['dur']); out.append(e)
    return out
def enclosing_ops(ev):
    """map runtime correlation -> list of enclosing cpu_op names/args (outer to inner)"""
    cpu=defaultdict(list)
    for e in ev:
        if e.get('cat') in ('cpu_op','Operator'):
            cpu[(e.get('pid'),e.get('tid'))].append(e)
    for k in cpu: cpu[k].sort(key=lambda e:e['ts'])
    starts={k:[e['ts'] for e in v] for k,v in cpu.items()}
    res={}
    for e in ev:
        if e.get('cat') in ('cuda_runtime','cuda_driver','Runtime'):
            c=e.get('args',{}).get('correlation')
            if c is None: continue
            k=(e.get('pid'),e.get('tid')); L=cpu.get(k,[])
            i=bisect.bisect_right(starts.get(k,[]), e['ts'])
            encl=[o for o in L[max(0,i-3000):i] if o['ts']<=e['ts'] and o['ts']+o['dur']>=e['ts']+e['dur']]
            res[c]=encl
    return res
