"""Batch mode: analyze every trace or job under some paths (directories, .tar/.tar.gz archives).

Writes, under OUTDIR: ``summary.parquet`` and ``summary.csv`` (one row per trace or job), one HTML
report and one JSON result per item in ``reports/``, and ``index.html`` linking them. Items run in a
local process pool, or on a Dask cluster (``scheduler``). Re-running skips items whose report is
newer than their input. A bad item is recorded with its error; the others go on.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceinsight.errors import InputError, TraceInsightError
from traceinsight.jobs import TRACE_SUFFIXES, rank_from_name
from traceinsight.parallel import process_pool

SUMMARY_METRICS = [
    "gpu_busy_ratio",
    "step_time_median_ns",
    "step_time_cv",
    "steps",
    "span_ns",
    "dataloader_ratio",
    "host_sync_count",
    "h2d_pageable_bytes_ratio",
    "comm_compute_overlap_ratio",
    "exposed_comm_ratio",
    "elementwise_kernel_time_share",
    "fp32_gemm_time_share",
    "recompute_time_share",
]
SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "label": pl.String(),
    "kind": pl.String(),
    "status": pl.String(),
    "error": pl.String(),
    "ranks": pl.Int64(),
    **{m: (pl.Int64() if m.endswith("_ns") or m in ("steps", "host_sync_count") else pl.Float64()) for m in SUMMARY_METRICS},
    "straggler_rank": pl.Int64(),
    "top_finding": pl.String(),
    "top_severity": pl.String(),
    "finding_ids": pl.String(),
    "report": pl.String(),
}
ARCHIVE_RE = re.compile(r"\.(tar|tar\.gz|tgz|tar\.bz2|tar\.xz)$")
MAX_MEMBER_BYTES = 8 * 1024**3


@dataclass(frozen=True)
class Item:
    label: str  # what the user knows it by: a path, or archive.tar.gz!member
    path: str  # local file or directory to analyze
    kind: str  # "trace" | "job"
    mtime_ns: int
    key: str  # safe, unique stem for output files


def _key(label: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(label.replace("!", "/")).name)[:60] or "trace"
    return f"{stem}-{hashlib.sha1(label.encode()).hexdigest()[:8]}"


def _is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES) and not name.endswith(".truth.json") and not name.startswith(".")


def _group_dir(d: Path, files: list[Path]) -> list[Item]:
    """A directory whose trace files each carry a distinct rank in their name is one job."""
    if len(files) >= 2:
        ranks = [rank_from_name(f.name) for f in files]
        if all(r is not None for r in ranks) and len(set(ranks)) == len(ranks):
            mt = max(f.stat().st_mtime_ns for f in files)
            return [Item(str(d), str(d), "job", mt, _key(str(d)))]
    return [Item(str(f), str(f), "trace", f.stat().st_mtime_ns, _key(str(f))) for f in files]


def _from_archive(archive: Path, workdir: Path) -> tuple[list[Item], list[dict[str, Any]]]:
    """Trace members are copied to generated names under ``workdir``; member paths are never
    used as disk paths (no traversal), links and devices are skipped."""
    items: list[Item] = []
    errors: list[dict[str, Any]] = []
    base = workdir / _key(str(archive))
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and _is_trace_name(Path(m.name).name)]
            groups: dict[str, list[tarfile.TarInfo]] = {}
            for m in members:
                groups.setdefault(str(Path(m.name).parent), []).append(m)
            for parent, ms in sorted(groups.items()):
                gdir = base / hashlib.sha1(parent.encode()).hexdigest()[:10]
                gdir.mkdir(parents=True, exist_ok=True)
                local = []
                for m in sorted(ms, key=lambda m: m.name):
                    label = f"{archive}!{m.name}"
                    if m.size > MAX_MEMBER_BYTES:
                        errors.append(_error_row(Item(label, "", "trace", 0, _key(label)), "archive member larger than the size limit"))
                        continue
                    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(m.name).name)
                    dest = gdir / safe
                    src = tar.extractfile(m)
                    if src is None:
                        continue
                    with src, open(dest, "wb") as out:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                    local.append((dest, label))
                group = _group_dir(gdir, [d for d, _ in local])
                names = dict(local)
                for it in group:
                    if it.kind == "job":
                        label = f"{archive}!{parent}"
                        items.append(Item(label, it.path, "job", archive.stat().st_mtime_ns, _key(label)))
                    else:
                        label = names[Path(it.path)]
                        items.append(Item(label, it.path, "trace", archive.stat().st_mtime_ns, _key(label)))
    except (tarfile.TarError, OSError, EOFError) as exc:
        errors.append(_error_row(Item(str(archive), str(archive), "trace", 0, _key(str(archive))), f"unreadable archive: {exc}"))
    return items, errors


def discover(paths: Iterable[Path], workdir: Path) -> tuple[list[Item], list[dict[str, Any]]]:
    items: list[Item] = []
    errors: list[dict[str, Any]] = []
    for p in paths:
        if not p.exists():
            errors.append(_error_row(Item(str(p), str(p), "trace", 0, _key(str(p))), "no such file or directory"))
        elif p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                rootp = Path(root)
                if workdir in (rootp, *rootp.parents):
                    continue
                tr = sorted(rootp / f for f in files if _is_trace_name(f))
                items.extend(_group_dir(rootp, tr))
                for f in sorted(files):
                    if ARCHIVE_RE.search(f):
                        a_items, a_err = _from_archive(rootp / f, workdir)
                        items.extend(a_items)
                        errors.extend(a_err)
        elif ARCHIVE_RE.search(p.name) or (p.suffix == ".gz" and tarfile.is_tarfile(p)):
            a_items, a_err = _from_archive(p, workdir)
            items.extend(a_items)
            errors.extend(a_err)
        else:
            items.append(Item(str(p), str(p), "trace", p.stat().st_mtime_ns, _key(str(p))))
    seen: set[str] = set()
    unique = []
    for it in items:
        if it.key not in seen:
            seen.add(it.key)
            unique.append(it)
    return unique, errors


def _error_row(item: Item, message: str) -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in SUMMARY_SCHEMA}
    row.update(label=item.label, kind=item.kind, status="error", error=message)
    return row


def _row(item: Item, doc: dict[str, Any], report: str) -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in SUMMARY_SCHEMA}
    m = doc["metrics"]
    if doc.get("kind") == "job":
        per = list(m["per_rank"].values())
        for k in SUMMARY_METRICS:
            vals = [r.get(k) for r in per if r.get(k) is not None]
            row[k] = (sum(vals) / len(vals)) if vals and isinstance(vals[0], float) else (max(vals) if vals else None)
        row["straggler_rank"] = m.get("straggler_rank")
    else:
        for k in SUMMARY_METRICS:
            row[k] = m.get(k)
    f = doc["findings"]
    row.update(
        label=item.label,
        kind=item.kind,
        status="ok",
        ranks=len(doc["source"]["ranks"]),
        top_finding=f[0]["id"] if f else None,
        top_severity=f[0]["severity"] if f else None,
        finding_ids=",".join(x["id"] for x in f if x["severity"] != "info"),
        report=report,
    )
    return row


def analyze_item(item: Item, outdir: str, force: bool = False) -> dict[str, Any]:
    """Worker (local process or Dask): analyze one item, write its report and JSON, return its row."""
    from traceinsight.report.files import write_bytes_atomic, write_text_atomic

    reports = Path(outdir) / "reports"
    html_path = reports / f"{item.key}.html"
    json_path = reports / f"{item.key}.json"
    rel = f"reports/{item.key}.html"
    if not force and html_path.exists() and json_path.exists() and html_path.stat().st_mtime_ns >= item.mtime_ns:
        try:
            cached = orjson.loads(json_path.read_bytes())
            return dict(cached["row"], _resumed=True)
        except (OSError, orjson.JSONDecodeError, KeyError):
            pass  # damaged cache: analyze again
    try:
        from traceinsight.report import html

        if item.kind == "job":
            from traceinsight.jobs import analyze_job

            doc = analyze_job(item.path, max_workers=1).to_json()
            page = html.render_job_html(doc)
        else:
            from traceinsight.api import analyze_path

            a = analyze_path(item.path)
            doc = a.to_json()
            page = html.render_html(doc)
        doc["source"]["path"] = item.label
        row = _row(item, doc, rel)
    except TraceInsightError as exc:
        return _error_row(item, exc.message)
    except Exception as exc:  # one bad trace never stops the batch
        return _error_row(item, f"internal error {type(exc).__name__}: {exc}")
    reports.mkdir(parents=True, exist_ok=True)
    write_text_atomic(html_path, page)
    write_bytes_atomic(json_path, orjson.dumps({"row": row, "result": doc}, default=str))
    return row


@dataclass
class BatchResult:
    rows: list[dict[str, Any]]
    resumed: int
    seconds: float

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if r["status"] != "ok")

    def frame(self) -> pl.DataFrame:
        clean = [{k: r.get(k) for k in SUMMARY_SCHEMA} for r in self.rows]
        return pl.DataFrame(clean, schema=SUMMARY_SCHEMA, orient="row").sort("label")


class _Progress:
    """A one-line progress bar on a terminal; silent in pipes and CI."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.enabled = enabled and sys.stderr.isatty() and not os.environ.get("CI")

    def update(self, row: dict[str, Any]) -> None:
        self.done += 1
        self.failed += row["status"] != "ok"
        if self.enabled:
            width = 30
            fill = int(width * self.done / max(1, self.total))
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} analyzed, {self.failed} failed")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _size(item: Item) -> int:
    p = Path(item.path)
    try:
        return sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size
    except OSError:
        return 0


def _run_local(items: list[Item], outdir: Path, force: bool, workers: int, on_row: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if workers <= 1 or len(items) <= 1:
        for it in items:
            rows.append(analyze_item(it, str(outdir), force))
            on_row(rows[-1])
        return rows
    with process_pool(workers) as pool:
        # largest first, so the long items do not start last and leave a worker idle at the end
        ordered = sorted(items, key=_size, reverse=True)
        futs = {pool.submit(analyze_item, it, str(outdir), force): it for it in ordered}
        for fut in as_completed(futs):
            try:
                row = fut.result()
            except Exception as exc:  # a worker died (out of memory, signal)
                row = _error_row(futs[fut], f"worker failed: {type(exc).__name__}: {exc}")
            rows.append(row)
            on_row(row)
    return rows


def _run_dask(items: list[Item], outdir: Path, force: bool, scheduler: str, workers: int, on_row: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    try:
        from dask.distributed import Client, LocalCluster
        from dask.distributed import as_completed as dask_completed
    except ImportError:
        raise InputError("Dask is not installed: pip install 'traceinsight-analyzer[dask]'") from None
    cluster = None
    if scheduler == "local":
        cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout="20s")
        except (OSError, TimeoutError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    rows: list[dict[str, Any]] = []
    try:
        futs = client.map(analyze_item, items, outdir=str(outdir), force=force, pure=False)
        index = {f.key: it for f, it in zip(futs, items, strict=True)}
        for fut in dask_completed(futs):
            try:
                row = fut.result()
            except Exception as exc:
                row = _error_row(index[fut.key], f"worker failed: {type(exc).__name__}: {exc}")
            rows.append(row)
            on_row(row)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return rows


def run_batch(
    paths: list[Path],
    outdir: Path,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    force: bool = False,
    progress: bool = True,
) -> BatchResult:
    t0 = time.perf_counter()
    outdir.mkdir(parents=True, exist_ok=True)
    workdir = outdir / ".extracted"
    items, errors = discover(paths, workdir.resolve())
    n_workers = workers or os.cpu_count() or 1
    bar = _Progress(len(items), progress)
    if scheduler:
        rows = _run_dask(items, outdir, force, scheduler, n_workers, bar.update)
    else:
        rows = _run_local(items, outdir, force, n_workers, bar.update)
    bar.close()
    resumed = sum(1 for r in rows if r.pop("_resumed", False))
    result = BatchResult(rows=rows + errors, resumed=resumed, seconds=time.perf_counter() - t0)
    write_outputs(result, outdir)
    return result


def write_outputs(result: BatchResult, outdir: Path) -> None:
    from traceinsight.report.files import atomic_path, write_text_atomic
    from traceinsight.report.html import render_index_html

    df = result.frame()
    with atomic_path(outdir / "summary.parquet") as tmp:
        df.write_parquet(tmp)
    buf = io.StringIO()
    df.write_csv(buf)
    write_text_atomic(outdir / "summary.csv", buf.getvalue())
    write_text_atomic(outdir / "index.html", render_index_html(df.to_dicts(), result.failed))
