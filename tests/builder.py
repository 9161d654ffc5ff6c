"""Hand-made event tables for tests: each call adds one row; times in microseconds (floats ok),
stored as int64 ns. ``trace()`` returns a :class:`Trace` as a parser would (conformed, kernels
classified), so analyzers and rules can be checked against hand-computed values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceinsight.model.classify import add_kernel_class
from traceinsight.model.schema import Trace, TraceMeta, conform

US = 1000


@dataclass
class Events:
    rows: list[dict[str, Any]] = field(default_factory=list)
    rank: int = 0
    pid: int = 1
    _corr: int = 0

    def _add(self, kind: str, name: str, start_us: float, dur_us: float, **cols: Any) -> Events:
        start, dur = round(start_us * US), round(dur_us * US)
        self.rows.append(
            {
                "kind": kind,
                "name": name,
                "start_ns": start,
                "end_ns": start + dur,
                "dur_ns": dur,
                "rank": self.rank,
                "pid": self.pid,
                **cols,
            }
        )
        return self

    def next_correlation(self) -> int:
        self._corr += 1
        return self._corr

    def op(
        self, name: str, start_us: float, dur_us: float, *, tid: int = 1, kind: str = "cpu_op"
    ) -> Events:
        return self._add(kind, name, start_us, dur_us, tid=tid)

    def annotation(self, name: str, start_us: float, dur_us: float, *, tid: int = 1) -> Events:
        return self._add("user_annotation", name, start_us, dur_us, tid=tid)

    def step(self, n: int, start_us: float, dur_us: float, *, tid: int = 1) -> Events:
        return self.annotation(f"ProfilerStep#{n}", start_us, dur_us, tid=tid)

    def runtime(
        self,
        name: str,
        start_us: float,
        dur_us: float,
        *,
        tid: int = 1,
        correlation: int | None = None,
    ) -> Events:
        return self._add("runtime", name, start_us, dur_us, tid=tid, correlation=correlation)

    def kernel(
        self,
        name: str,
        start_us: float,
        dur_us: float,
        *,
        launch_us: float | None = None,
        launch_dur_us: float = 5,
        device: int = 0,
        stream: int = 7,
        tid: int = 1,
    ) -> Events:
        """A kernel; with ``launch_us``, its ``cudaLaunchKernel`` call too (same correlation)."""
        corr = self.next_correlation()
        if launch_us is not None:
            self.runtime("cudaLaunchKernel", launch_us, launch_dur_us, tid=tid, correlation=corr)
        return self._add(
            "kernel", name, start_us, dur_us, device=device, stream=stream, correlation=corr
        )

    def memcpy(
        self,
        copy_kind: str,
        start_us: float,
        dur_us: float,
        *,
        nbytes: int,
        src: str,
        dst: str,
        device: int = 0,
        stream: int = 7,
    ) -> Events:
        corr = self.next_correlation()
        return self._add(
            "memcpy",
            f"Memcpy {copy_kind}",
            start_us,
            dur_us,
            device=device,
            stream=stream,
            correlation=corr,
            copy_kind=copy_kind,
            bytes=nbytes,
            src_kind=src,
            dst_kind=dst,
        )

    def trace(self, path: str = "builder") -> Trace:
        df = pl.DataFrame(self.rows, infer_schema_length=None) if self.rows else pl.DataFrame()
        table = (
            conform(df)
            if self.rows
            else conform(pl.DataFrame({"start_ns": pl.Series([], dtype=pl.Int64)}))
        )
        return Trace(
            events=add_kernel_class(table),
            meta=TraceMeta(source_path=path, format="kineto", format_version="builder"),
        )
