"""Runs the peer (HolisticTraceAnalysis) the way the comparison in benchmarks/RESULTS.md needs:
load + temporal breakdown + idle time breakdown + comm/comp overlap + kernel breakdown.

    HTA_PYTHON benchmarks/hta_run.py TRACE_DIR
"""

import sys

from hta.trace_analysis import TraceAnalysis

analyzer = TraceAnalysis(trace_dir=sys.argv[1])
analyzer.get_temporal_breakdown(visualize=False)
analyzer.get_idle_time_breakdown(ranks=sorted(analyzer.t.traces), visualize=False)
analyzer.get_comm_comp_overlap(visualize=False)
analyzer.get_gpu_kernel_breakdown(visualize=False)
