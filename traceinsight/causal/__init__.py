"""The causal step model, in one place: what it is built from and how (``build``), the graph
and its replay (``graph``), the fixes as typed transforms of it (``transforms``), and what a
prediction is (``whatif``: :class:`WhatIf`). Depends only on the model layer below it;
analyzers build and replay it, findings bind each rule's fix to a transform.
"""
