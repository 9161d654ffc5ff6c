"""rocprofv3 (docs/ROCPROF.md): the real JSON of a PyTorch training run on MI350X checked against sums
over its raw records (plain json here, not our parser); a rocpd database built from the real
schema (fixtures/rocprof: the schema is real, the rows below are made by hand) with hand-computed
values; and the refusals: an unknown rocpd schema version, the older RPD format, a damaged
rocprofv3 JSON."""

from __future__ import annotations

import gzip
import hashlib
import json
import sqlite3
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from traceinsight import analyze
from traceinsight.cli import main
from traceinsight.errors import InputError
from traceinsight.parsers import detect_format, load_trace

from .conftest import FIXTURES, analyzed, raw_json, shared_or_skip

SCHEMA_SQL = FIXTURES / "rocprof" / "perfadvisor__rocpd_schema_observed.sql"
GUID = "00000450-565d-765d-bc41-19a2073d19ee"
SUFFIX = "_" + GUID.replace("-", "_")


def real_json() -> Path:
    return shared_or_skip() / "rocprof" / "tracelens_908_results.json.gz"


def union_ns(spans: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) spans: a plain sweep, independent of our intervals."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


@pytest.fixture(scope="module")
def raw() -> dict:
    with gzip.open(real_json()) as fh:
        return json.load(fh)["rocprofiler-sdk-tool"][0]


@pytest.fixture(scope="module")
def real_trace():
    return load_trace(real_json())


def test_real_json_is_detected_by_content(tmp_path: Path) -> None:
    src = real_json()
    assert detect_format(src) == "rocprof-json"
    plain = tmp_path / "any_name.json"  # neither the suffix nor the name decide it
    plain.write_bytes(raw_json(src))
    assert detect_format(plain) == "rocprof-json"


def test_real_json_kernels_match_the_raw_records(raw: dict, real_trace) -> None:
    dispatches = raw["buffer_records"]["kernel_dispatch"]
    ev = real_trace.events
    kernels = ev.filter(pl.col("kind") == "kernel")
    # dispatch count and kernel time: every record, summed here from the JSON itself
    assert len(dispatches) == 43_915 == kernels.height == ev.height
    raw_ns = sum(r["end_timestamp"] - r["start_timestamp"] for r in dispatches)
    assert raw_ns == 4_441_741_378 == kernels["dur_ns"].sum()
    assert kernels["start_ns"].min() == min(r["start_timestamp"] for r in dispatches)
    # names from kernel_symbols (by kernel id): the most dispatched kernel, named as rocprofv3 does
    top_id, top_n = Counter(r["dispatch_info"]["kernel_id"] for r in dispatches).most_common(1)[0]
    symbol = next(s for s in raw["kernel_symbols"] if s["kernel_id"] == top_id)
    assert kernels.filter(pl.col("name") == symbol["formatted_kernel_name"]).height == top_n == 5450
    # queue as stream, the internal correlation id, one process = rank 0
    assert sorted(kernels["stream"].unique().to_list()) == sorted(
        {r["dispatch_info"]["queue_id"]["handle"] for r in dispatches}
    )
    assert sorted(kernels["correlation"].to_list()) == sorted(
        r["correlation_id"]["internal"] for r in dispatches
    )
    assert kernels["tid"].null_count() == kernels.height  # GPU rows: a process, no thread
    assert kernels["rank"].unique().to_list() == [0] and kernels["pid"].unique().to_list() == [908]
    assert real_trace.meta.extra["rocprof_traced"] == ["kernel_dispatch"]
    # the agent as device: all dispatches went to the first GPU agent (logical type index 0)
    agent = next(a for a in raw["agents"] if a["id"]["handle"] == 37946)
    assert agent["type"] == 2 and agent["logical_node_type_id"] == 0
    assert kernels["device"].unique().to_list() == [0]
    (dev,) = real_trace.meta.devices
    assert (dev.id, dev.name, dev.sm_count) == (0, "AMD Instinct MI350X", 256)
    assert dev.memory_bytes == agent["mem_banks"][0]["size_in_bytes"] == 309_220_868_096
    # RCCL's kernels are communication (1,310 ncclDevKernel_Generic_1 dispatches)
    nccl = sum(
        1
        for r in dispatches
        if raw["kernel_symbols"][r["dispatch_info"]["kernel_id"]][
            "formatted_kernel_name"
        ].startswith("ncclDevKernel")
    )
    assert nccl == 1310 == kernels.filter(pl.col("kernel_class") == "communication").height


def test_real_json_launch_configuration(raw: dict, real_trace) -> None:
    """Grid and workgroup sizes into kernel_args: HSA's grid counts work-items, the table's grid
    counts workgroups (CUDA's blocks): ceil(grid / workgroup) per dimension."""
    dispatches = raw["buffer_records"]["kernel_dispatch"]
    ka = real_trace.kernel_args
    assert ka.height == len(dispatches)
    first = min(dispatches, key=lambda r: r["start_timestamp"])
    info = first["dispatch_info"]
    row = ka.filter(pl.col("correlation") == first["correlation_id"]["internal"]).row(0, named=True)
    assert info["grid_size"] == {"x": 512, "y": 1, "z": 1}
    assert info["workgroup_size"] == {"x": 512, "y": 1, "z": 1}
    assert (row["grid_x"], row["block_x"], row["grid_y"], row["block_y"]) == (1, 512, 1, 1)
    sym = raw["kernel_symbols"][info["kernel_id"]]
    assert row["registers_per_thread"] == sym["arch_vgpr_count"] + sym["accum_vgpr_count"] == 8
    workgroups = sum(
        -(-r["dispatch_info"]["grid_size"]["x"] // r["dispatch_info"]["workgroup_size"]["x"])
        for r in dispatches
    )
    assert ka["grid_x"].sum() == workgroups


def test_real_json_analysis(raw: dict) -> None:
    """Busy ratio against the union of the raw dispatch spans over first start..last end; the
    idle time is not blamed on the host (no API call was traced) and the summary says once what
    the capture lacks."""
    dispatches = raw["buffer_records"]["kernel_dispatch"]
    spans = [(r["start_timestamp"], r["end_timestamp"]) for r in dispatches]
    window = max(e for _, e in spans) - min(s for s, _ in spans)
    busy = union_ns(spans)
    assert (window, busy) == (15_122_023_494, 4_233_112_334)
    a = analyzed(real_json())
    m = a.metrics
    assert m["window_ns"] == window
    assert m["gpu_busy_ratio"] == pytest.approx(busy / window, abs=1e-12)  # 0.2799
    assert m["idle_by_cause_ns"]["host_untraced"] == window - busy
    assert m["idle_by_cause_ns"]["cpu_work"] == 0 and m["idle_by_cause_ns"]["gpu_wait"] == 0
    doc = a.to_json()
    notes = [w for w in doc["warnings"] if w.startswith("rocprofv3 capture without")]
    assert len(notes) == 1 and "kernel trace only" in notes[0]
    assert doc["source"]["format"] == "rocprof-json"
    kernels = {r["kernel_class"]: r for r in doc["details"]["kernels"]["by_class"]}
    assert kernels["communication"]["count"] == 1310
    assert sum(r["count"] for r in kernels.values()) == len(dispatches)
    assert sum(r["total_ns"] for r in kernels.values()) == 4_441_741_378
    # no copies, syncs or markers were traced: none reported
    assert doc["details"]["copies"]["by_kind"] == [] and doc["details"]["regions"]["regions"] == []


def test_real_json_cli_end_to_end(tmp_path: Path, capsys) -> None:
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    before = hashlib.sha256(real_json().read_bytes()).hexdigest()
    assert main(["analyze", str(real_json()), "-o", str(out), "--json", str(js)]) == 0
    term = capsys.readouterr().out
    assert "rocprof-json" in term and "AMD Instinct MI350X" in term and "host_untraced" in term
    assert out.read_text().startswith("<!doctype html>")
    assert json.loads(js.read_text())["metrics"]["gpu_busy_ratio"] == pytest.approx(
        0.27993, abs=1e-5
    )
    assert hashlib.sha256(real_json().read_bytes()).hexdigest() == before  # input untouched


# --- rocpd: the real schema, made rows ------------------------------------------------------

T0 = 5_000_000_000  # rocprofiler's monotonic clock, made up


def rocpd_db(path: Path, *, version: str | None = "3") -> Path:
    """A rocpd database: the real v3 schema (GUID-suffixed tables, their views) with made rows.

    Process 4242 (thread 4242 launches, thread 4250 only calls HSA), node agents: CPU (id 1), GPU 0
    MI300X (id 2), GPU 1 (id 3). Times are T0 + ns:

      step 1 (roctx "ProfilerStep#1" 0-10,000)
        hipMemcpyAsync 100-300 (corr 1)  -> copy HtoD 400-1,400, 4,096 bytes, CPU -> GPU 0
        hipLaunchKernel 500-700 (corr 2) -> GEMM 1,500-4,500 on GPU 0 queue 1; grid 1024 x 2,
                                            workgroup 256 x 1: 4 x 2 workgroups; 64 + 32 VGPRs
        hipLaunchKernel 800-1,000 (corr 3) -> elementwise 4,600-5,600 on GPU 0 queue 1
        hipStreamSynchronize 1,100-5,700 (corr 4)
        hsa_signal_wait_scacquire 5,000-5,100 (corr 7, thread 4250)
      step 2 (roctx "ProfilerStep#2" 10,000-20,000)
        hipLaunchKernel 10,100-10,300 (corr 5) -> GEMM 10,400-13,400 on GPU 0 queue 1
        hipMemcpyAsync 10,500-10,600 (corr 6) -> copy DtoD 13,500-14,000, 1 MiB, GPU 0 -> GPU 1

    Hand-computed: 3 kernels, 7,000 ns; copies HtoD 4,096 bytes (GPU 0) and peer 1,048,576 bytes
    (GPU 1); GPU 0 busy 1,000 + 3,000 + 1,000 + 3,000 = 8,000 ns, GPU 1 500 ns; 6 HIP calls
    (runtime), 1 HSA call (driver); 1 sync of 4,600 ns; 2 roctx ranges.
    """
    sql = SCHEMA_SQL.read_text().replace("CREATE TABLE sqlite_sequence(name,seq);\n", "")
    con = sqlite3.connect(path)
    con.executescript(sql)

    def put(table: str, **row: object) -> None:
        cols = ", ".join(f'"{c}"' for c in row)
        marks = ", ".join("?" for _ in row)
        con.execute(
            f"INSERT INTO rocpd_{table}{SUFFIX} ({cols}) VALUES ({marks})", list(row.values())
        )

    if version is not None:
        put("metadata", tag="schema_version", value=version)
    put("metadata", tag="guid", value=GUID)
    strings = [
        "HIP_RUNTIME_API_EXT",
        "HSA_CORE_API",
        "MARKER_CORE_RANGE_API",
        "KERNEL_DISPATCH",
        "MEMORY_COPY",
        "hipMemcpyAsync",
        "hipLaunchKernel",
        "hipStreamSynchronize",
        "hsa_signal_wait_scacquire",
        "roctxRangePushA",
        "MEMORY_COPY_HOST_TO_DEVICE",
        "MEMORY_COPY_DEVICE_TO_DEVICE",
        "",
    ]
    sid = {s: i + 1 for i, s in enumerate(strings)}
    for s, i in sid.items():
        put("string", id=i, string=s)
    put("info_node", id=1, hash=7, machine_id="made", hostname="made")
    put("info_process", id=1, nid=1, pid=4242, command="python train.py")
    put("info_thread", id=1, nid=1, pid=1, tid=4242)
    put("info_thread", id=2, nid=1, pid=1, tid=4250)
    put(
        "info_agent",
        id=1,
        nid=1,
        pid=1,
        type="CPU",
        absolute_index=0,
        logical_index=0,
        type_index=0,
        name="AMD EPYC",
    )
    for aid, idx in ((2, 0), (3, 1)):
        ext = json.dumps({"cu_count": 304, "mem_banks": [{"size_in_bytes": 206_141_652_992}]})
        put(
            "info_agent",
            id=aid,
            nid=1,
            pid=1,
            type="GPU",
            absolute_index=aid - 1,
            logical_index=aid - 1,
            type_index=idx,
            name="gfx942",
            product_name="AMD Instinct MI300X",
            extdata=ext,
        )
    put("info_queue", id=1, nid=1, pid=1, name="queue 1")
    put("info_stream", id=1, nid=1, pid=1, name="Default Stream")
    put("info_code_object", id=1, nid=1, pid=1, agent_id=2, uri="memory://made")
    gemm = "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x256_MI16x16x1_SN_LDSB1"
    elementwise = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
    put(
        "info_kernel_symbol",
        id=1,
        nid=1,
        pid=1,
        code_object_id=1,
        kernel_name=gemm + ".kd",
        display_name=gemm,
        arch_vgpr_count=64,
        accum_vgpr_count=32,
    )
    put(
        "info_kernel_symbol",
        id=2,
        nid=1,
        pid=1,
        code_object_id=1,
        kernel_name="_Z3fooPf.kd",
        display_name=elementwise,
        arch_vgpr_count=16,
        accum_vgpr_count=0,
    )

    event = iter(range(1, 100))

    def api(
        corr: int,
        name: str,
        cat: str,
        start: int,
        end: int,
        tid: int = 1,
        message: str | None = None,
    ) -> None:
        eid = next(event)
        ext = json.dumps({"message": message}) if message else "{}"
        put(
            "event",
            id=eid,
            category_id=sid[cat],
            stack_id=corr,
            parent_stack_id=0,
            correlation_id=0,
            extdata=ext,
        )
        put(
            "region",
            id=corr,
            nid=1,
            pid=1,
            tid=tid,
            start=T0 + start,
            end=T0 + end,
            name_id=sid[name],
            event_id=eid,
        )

    def dispatch(
        corr: int, kernel: int, start: int, end: int, grid: tuple[int, int], wg: int
    ) -> None:
        eid = next(event)
        put(
            "event",
            id=eid,
            category_id=sid["KERNEL_DISPATCH"],
            stack_id=corr,
            parent_stack_id=corr,
            correlation_id=0,
        )
        put(
            "kernel_dispatch", id=corr, nid=1, pid=1, tid=1, agent_id=2, kernel_id=kernel, dispatch_id=corr,
            queue_id=1, stream_id=1, start=T0 + start, end=T0 + end, private_segment_size=0, group_segment_size=8192,
            workgroup_size_x=wg, workgroup_size_y=1, workgroup_size_z=1, grid_size_x=grid[0], grid_size_y=grid[1],
            grid_size_z=1, region_name_id=sid[""], event_id=eid,
        )  # fmt: skip

    def copy(corr: int, op: str, start: int, end: int, size: int, src: int, dst: int) -> None:
        eid = next(event)
        put(
            "event",
            id=eid,
            category_id=sid["MEMORY_COPY"],
            stack_id=corr,
            parent_stack_id=corr,
            correlation_id=0,
        )
        put(
            "memory_copy", nid=1, pid=1, tid=1, start=T0 + start, end=T0 + end, name_id=sid[op],
            src_agent_id=src, dst_agent_id=dst, size=size, stream_id=1, event_id=eid,
        )  # fmt: skip

    hip = "HIP_RUNTIME_API_EXT"
    api(101, "roctxRangePushA", "MARKER_CORE_RANGE_API", 0, 10_000, message="ProfilerStep#1")
    api(102, "roctxRangePushA", "MARKER_CORE_RANGE_API", 10_000, 20_000, message="ProfilerStep#2")
    api(1, "hipMemcpyAsync", hip, 100, 300)
    api(2, "hipLaunchKernel", hip, 500, 700)
    api(3, "hipLaunchKernel", hip, 800, 1_000)
    api(4, "hipStreamSynchronize", hip, 1_100, 5_700)
    api(7, "hsa_signal_wait_scacquire", "HSA_CORE_API", 5_000, 5_100, tid=2)
    api(5, "hipLaunchKernel", hip, 10_100, 10_300)
    api(6, "hipMemcpyAsync", hip, 10_500, 10_600)
    copy(1, "MEMORY_COPY_HOST_TO_DEVICE", 400, 1_400, 4_096, 1, 2)
    dispatch(2, 1, 1_500, 4_500, (1024, 2), 256)
    dispatch(3, 2, 4_600, 5_600, (65536, 1), 512)
    dispatch(5, 1, 10_400, 13_400, (1024, 2), 256)
    copy(6, "MEMORY_COPY_DEVICE_TO_DEVICE", 13_500, 14_000, 1 << 20, 2, 3)
    con.commit()
    con.close()
    return path


@pytest.fixture
def made_db(tmp_path: Path) -> Path:
    return rocpd_db(tmp_path / "rank_4242_results.db")


def test_rocpd_made_rows(made_db: Path) -> None:
    assert detect_format(made_db) == "rocpd"
    tr = load_trace(made_db)
    ev = tr.events
    assert tr.meta.format == "rocpd" and tr.meta.format_version == "rocpd schema 3"
    assert tr.meta.extra["rocprof_traced"] == [
        "hip_api",
        "hsa_api",
        "kernel_dispatch",
        "marker_api",
        "memory_copy",
    ]
    assert [(d.id, d.name, d.sm_count, d.memory_bytes) for d in tr.meta.devices] == [
        (0, "AMD Instinct MI300X", 304, 206_141_652_992),
        (1, "AMD Instinct MI300X", 304, 206_141_652_992),
    ]
    k = ev.filter(pl.col("kind") == "kernel").sort("start_ns")
    assert k["dur_ns"].to_list() == [3_000, 1_000, 3_000] and k["dur_ns"].sum() == 7_000
    assert k["start_ns"].to_list() == [T0 + 1_500, T0 + 4_600, T0 + 10_400]
    assert k["kernel_class"].to_list() == ["gemm", "elementwise", "gemm"]
    assert k["device"].to_list() == [0, 0, 0] and k["stream"].to_list() == [1, 1, 1]
    assert k["correlation"].to_list() == [2, 3, 5]
    assert k["pid"].unique().to_list() == [4242] and k["tid"].null_count() == 3
    # HIP/HSA calls: runtime/driver rows, each dispatch correlated with its hipLaunchKernel
    api = ev.filter(pl.col("kind").is_in(["runtime", "driver"]))
    assert Counter(zip(api["kind"].to_list(), api["name"].to_list(), strict=True)) == {
        ("runtime", "hipMemcpyAsync"): 2,
        ("runtime", "hipLaunchKernel"): 3,
        ("runtime", "hipStreamSynchronize"): 1,
        ("driver", "hsa_signal_wait_scacquire"): 1,
    }
    launches = k.join(api.select("correlation", pl.col("name").alias("api")), on="correlation")
    assert launches["api"].to_list() == ["hipLaunchKernel"] * 3
    assert api.filter(pl.col("kind") == "driver")["tid"].to_list() == [4250]
    # copies: direction, bytes, memory kinds, the device end; GPU 0 -> GPU 1 is peer-to-peer
    c = ev.filter(pl.col("kind") == "memcpy").sort("start_ns")
    assert c.select("copy_kind", "bytes", "device", "src_kind", "dst_kind").rows() == [
        ("HtoD", 4_096, 0, "host", "device"),
        ("PtoP", 1_048_576, 1, "device", "device"),
    ]
    assert c["correlation"].to_list() == [1, 6]
    # roctx ranges as annotations, named by their message
    m = ev.filter(pl.col("kind") == "user_annotation").sort("start_ns")
    assert m["name"].to_list() == ["ProfilerStep#1", "ProfilerStep#2"]
    assert m["dur_ns"].to_list() == [10_000, 10_000]
    # launch configuration: 1024 x 2 work-items in workgroups of 256 = 4 x 2 workgroups
    ka = tr.kernel_args.sort("start_ns").row(0, named=True)
    assert (ka["grid_x"], ka["grid_y"], ka["block_x"]) == (4, 2, 256)
    assert ka["registers_per_thread"] == 96 and ka["shared_memory_bytes"] == 8192
    assert (ev["rank"] == 0).all()


def test_rocpd_made_rows_analysis(made_db: Path) -> None:
    a = analyzed(made_db)
    m, d = a.metrics, a.to_json()["details"]
    assert m["steps"] == 2  # from the roctx ranges
    assert m["host_sync_count"] == 1 and m["host_sync_blocked_ns"] == 4_600
    assert m["h2d_bytes"] == 4_096
    assert d["kernels"]["kernel_count"] == 3 and d["kernels"]["kernel_ns"] == 7_000
    assert {r["kernel_class"]: r["count"] for r in d["kernels"]["by_class"]} == {
        "gemm": 2,
        "elementwise": 1,
    }
    busy = {r["device"]: r["busy_ns"] for r in d["idle"]["devices"]}
    assert busy == {0: 8_000, 1: 500}
    # the window is the two roctx steps, 0-20,000 (the GPU work ends inside them): busy over
    # both devices' windows (8,000 + 500) / (2 x 20,000)
    assert m["window_ns"] == 20_000 and m["gpu_busy_ratio"] == pytest.approx(8_500 / 40_000)
    assert m["idle_by_cause_ns"]["host_untraced"] == 0  # API calls were traced: causes are told
    kinds = {r["copy_kind"]: r for r in d["copies"]["by_kind"]}
    assert set(kinds) == {"HtoD", "PtoP"}
    notes = [w for w in a.to_json()["warnings"] if w.startswith("rocprofv3 records no PyTorch")]
    assert len(notes) == 1


def test_rocpd_cli_end_to_end(made_db: Path, tmp_path: Path, capsys) -> None:
    before = hashlib.sha256(made_db.read_bytes()).hexdigest()
    assert main(["analyze", str(made_db), "--json", "-", "-o", str(tmp_path / "r.html")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["format"] == "rocpd" and doc["metrics"]["steps"] == 2
    assert hashlib.sha256(made_db.read_bytes()).hexdigest() == before
    assert {p.name for p in made_db.parent.iterdir()} == {made_db.name, "r.html"}  # no -journal


# --- refusals: one line, exit code 2 -------------------------------------------------------


def refused(path: Path, capsys) -> str:
    assert main(["analyze", str(path), "--no-html"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and str(path) in err
    return err


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("4", "rocpd schema version 4 is not supported"),
        ("2.1", "rocpd schema version 2.1 is not supported"),
        ("three", "without a readable schema version"),
        (None, "without a readable schema version"),
    ],
)
def test_rocpd_unknown_schema_version_is_refused(tmp_path: Path, capsys, version, says) -> None:
    db = rocpd_db(tmp_path / "results.db", version=version)
    with pytest.raises(InputError, match=says):
        load_trace(db)
    assert says in refused(db, capsys)


def test_rpd_database_is_recognised_and_refused(tmp_path: Path, capsys) -> None:
    """rocmProfileData's RPD names its tables rocpd_* too (and has a rocpd_metadata table)."""
    db = tmp_path / "trace.rpd"
    con = sqlite3.connect(db)
    con.executescript(
        """
        CREATE TABLE rocpd_metadata (id integer PRIMARY KEY, tag varchar(4096), value varchar(4096));
        CREATE TABLE rocpd_string (id integer PRIMARY KEY, string varchar(4096));
        CREATE TABLE rocpd_op (id integer PRIMARY KEY, gpuId integer, queueId integer,
            sequenceId integer, completionSignal varchar(18), start integer, end integer,
            description_id integer, opType_id integer);
        CREATE TABLE rocpd_api (id integer PRIMARY KEY, pid integer, tid integer, start integer,
            end integer, apiName_id integer, args_id integer);
        CREATE TABLE rocpd_api_ops (id integer PRIMARY KEY, api_id integer, op_id integer);
        INSERT INTO rocpd_metadata (tag, value) VALUES ('schema_version', '2');
        """
    )
    con.close()
    assert detect_format(db) == "rocpd"
    assert "rocmProfileData (RPD)" in refused(db, capsys)


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (b'{"rocprofiler-sdk-tool": [{"metadata": {"pid": 1}, "buffer_records": {"kernel_dispatch": [{"thread_id": 1', "damaged rocprofv3 JSON"),
        (b'{"rocprofiler-sdk-tool": [{"metadata": {"pid": 1}, "buffer_records": {"kernel_dispatch": [{"thread_id": 1, "correlation_id": {"internal": 1}, "start_timestamp": "soon", "end_timestamp": 2, "dispatch_info": {}}]}}]}', "kernel_dispatch[0].start_timestamp"),
        (b'{"rocprofiler-sdk-tool": []}', "lists no process"),
    ],
)  # fmt: skip
def test_damaged_rocprof_json_is_refused(tmp_path: Path, capsys, doc: bytes, says: str) -> None:
    path = tmp_path / "908_results.json"
    path.write_bytes(doc)
    assert detect_format(path) == "rocprof-json"
    assert says in refused(path, capsys)


# --- the JSON's other domains: a made two-process document ---------------------------------


def made_json(path: Path) -> Path:
    """A rocprofv3 JSON document of two processes, made by hand in the writer's record shapes
    (rocprofiler-sdk's serialization: records name their kind and operation by index into
    ``strings.buffer_records``; roctx messages are keyed by the range's correlation id).

    Node agents: CPU (handle 10), GPU 0 (11), GPU 1 (12); times in ns.
      pid 100: roctx "forward" 50-3,000; hipLaunchKernel 100-200 (corr 1) -> kernel 1,000-2,000 on
               GPU 0 queue 5 (grid 256, workgroup 64: 4 workgroups); hipMemcpyAsync 300-400
               (corr 2) -> copy HtoD 2,100-2,300, 1,000 bytes; hipStreamSynchronize 500-2,500
      pid 200: hipLaunchKernel 1,000-1,100 (corr 1, the same id: ids are per process) -> kernel
               1,500-1,800 on GPU 1 queue 7
    """
    kinds = ["NONE"] * 33
    ops: dict[int, list[str]] = {}
    kinds[5], ops[5] = (
        "HIP_RUNTIME_API",
        ["hipNone", "hipLaunchKernel", "hipMemcpyAsync", "hipStreamSynchronize"],
    )
    kinds[10], ops[10] = (
        "MEMORY_COPY",
        ["MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST", "MEMORY_COPY_HOST_TO_DEVICE"],
    )
    kinds[11], ops[11] = (
        "KERNEL_DISPATCH",
        ["KERNEL_DISPATCH_NONE", "KERNEL_DISPATCH_ENQUEUE", "KERNEL_DISPATCH_COMPLETE"],
    )
    kinds[32], ops[32] = "MARKER_CORE_RANGE_API", ["roctxRangePushA"]
    strings = [{"kind": k, "operations": ops.get(i, [])} for i, k in enumerate(kinds)]
    agents = [
        {"id": {"handle": 10}, "type": 1, "logical_node_type_id": 0, "name": "AMD EPYC"},
        *(
            {
                "id": {"handle": 11 + i},
                "type": 2,
                "logical_node_type_id": i,
                "name": "gfx942",
                "product_name": "AMD Instinct MI300X",
                "cu_count": 304,
                "mem_banks": [{"size_in_bytes": 206_141_652_992}],
            }
            for i in range(2)
        ),
    ]

    def api(kind: int, op: int, corr: int, start: int, end: int, tid: int) -> dict:
        return {
            "size": 48,
            "kind": kind,
            "operation": op,
            "correlation_id": {"internal": corr, "external": 0, "ancestor": 0},
            "start_timestamp": start,
            "end_timestamp": end,
            "thread_id": tid,
        }

    def dispatch(corr: int, start: int, end: int, agent: int, queue: int, tid: int) -> dict:
        return {
            "size": 184,
            "kind": 11,
            "operation": 2,
            "thread_id": tid,
            "correlation_id": {"internal": corr, "external": 0},
            "start_timestamp": start,
            "end_timestamp": end,
            "dispatch_info": {
                "size": 72,
                "agent_id": {"handle": agent},
                "queue_id": {"handle": queue},
                "kernel_id": 1,
                "dispatch_id": corr,
                "private_segment_size": 0,
                "group_segment_size": 0,
                "workgroup_size": {"x": 64, "y": 1, "z": 1},
                "grid_size": {"x": 256, "y": 1, "z": 1},
            },
            "stream_id": {"handle": 1},
        }

    symbols = [
        {"kernel_id": 0, "kernel_name": "", "formatted_kernel_name": "0"},
        {
            "kernel_id": 1,
            "kernel_name": "_Z6reducePf.kd",
            "formatted_kernel_name": "void at::native::reduce_kernel<512, 1>(float*)",
            "arch_vgpr_count": 24,
            "accum_vgpr_count": 0,
        },
    ]

    def process(pid: int, records: dict, messages: list[dict]) -> dict:
        empty = dict.fromkeys(
            ("kernel_dispatch", "hip_api", "hsa_api", "marker_api", "rccl_api", "memory_copy"), []
        )
        return {
            "metadata": {"pid": pid, "init_time": 0, "fini_time": 10_000},
            "agents": agents,
            "strings": {"buffer_records": strings, "marker_api": messages},
            "kernel_symbols": symbols,
            "buffer_records": {**empty, **records},
        }

    copy = {
        **api(10, 2, 2, 2_100, 2_300, 100),
        "dst_agent_id": {"handle": 11},
        "src_agent_id": {"handle": 10},
        "bytes": 1_000,
    }
    doc = {
        "rocprofiler-sdk-tool": [
            process(
                100,
                {
                    "hip_api": [
                        api(5, 1, 1, 100, 200, 100),
                        api(5, 2, 2, 300, 400, 100),
                        api(5, 3, 3, 500, 2_500, 100),
                    ],
                    "kernel_dispatch": [dispatch(1, 1_000, 2_000, 11, 5, 100)],
                    "memory_copy": [copy],
                    "marker_api": [api(32, 0, 50, 50, 3_000, 100)],
                },
                [{"key": 50, "value": "forward"}],
            ),
            process(
                200,
                {
                    "hip_api": [api(5, 1, 1, 1_000, 1_100, 200)],
                    "kernel_dispatch": [dispatch(1, 1_500, 1_800, 12, 7, 200)],
                },
                [],
            ),
        ]
    }
    path.write_text(json.dumps(doc))
    return path


def test_made_json_two_processes(tmp_path: Path) -> None:
    tr = load_trace(made_json(tmp_path / "results.json"))
    ev = tr.events
    assert tr.meta.world_size == 2 and [d.id for d in tr.meta.devices] == [0, 1]
    assert tr.meta.extra["rocprof_traced"] == [
        "hip_api",
        "kernel_dispatch",
        "marker_api",
        "memory_copy",
    ]
    k = ev.filter(pl.col("kind") == "kernel").sort("rank")
    assert k.select("rank", "pid", "device", "stream", "dur_ns").rows() == [
        (0, 100, 0, 5, 1_000),
        (1, 200, 1, 7, 300),
    ]
    assert k["name"].to_list() == ["void at::native::reduce_kernel<512, 1>(float*)"] * 2
    # correlation ids repeat across processes: each dispatch finds its own process's launch
    calls = ev.filter(pl.col("kind") == "runtime").select(
        "rank", "correlation", pl.col("name").alias("api"), pl.col("start_ns").alias("at")
    )
    joined = k.join(calls, on=["rank", "correlation"]).sort("rank")
    assert joined.select("api", "at").rows() == [
        ("hipLaunchKernel", 100),
        ("hipLaunchKernel", 1_000),
    ]
    c = ev.filter(pl.col("kind") == "memcpy")
    assert c.select("rank", "copy_kind", "bytes", "device", "correlation").rows() == [
        (0, "HtoD", 1_000, 0, 2)
    ]
    m = ev.filter(pl.col("kind") == "user_annotation")
    assert m.select("rank", "name", "start_ns", "dur_ns").rows() == [(0, "forward", 50, 2_950)]
    ka = tr.kernel_args.sort("rank")
    assert ka.select("rank", "grid_x", "block_x", "registers_per_thread").rows() == [
        (0, 4, 64, 24),
        (1, 4, 64, 24),
    ]


def test_made_json_analysis_per_rank(tmp_path: Path) -> None:
    job = analyzed(made_json(tmp_path / "results.json"))
    doc = job.to_json()
    assert doc["source"]["world_size"] == 2
    rank0 = analyze(tmp_path / "results.json", rank=0)
    m = rank0.metrics
    assert m["host_sync_count"] == 1 and m["host_sync_blocked_ns"] == 2_000
    assert m["h2d_bytes"] == 1_000
    regions = {r["name"]: r for r in rank0.to_json()["details"]["regions"]["regions"]}
    assert regions["forward"]["gpu_ns"] == 1_000 + 200  # the kernel and the copy it launched


def test_damaged_rocpd_rows_and_files(made_db: Path, tmp_path: Path, capsys) -> None:
    """SQLite keeps any value in any column: a dispatch whose start is text is left out and
    counted; a database cut short is refused in one line."""
    con = sqlite3.connect(made_db)
    con.execute(f"UPDATE rocpd_kernel_dispatch{SUFFIX} SET start = 'soon' WHERE id = 3")
    con.commit()
    con.close()
    tr = load_trace(made_db)
    assert tr.events.filter(pl.col("kind") == "kernel")["correlation"].to_list() == [2, 5]
    assert "1 records end before they start or have no time: left out" in tr.meta.warnings
    cut = tmp_path / "cut.db"
    cut.write_bytes(made_db.read_bytes()[:8192])
    err = refused(cut, capsys)
    assert "cut.db" in err


def test_locked_rocpd_is_one_line(made_db: Path, capsys) -> None:
    con = sqlite3.connect(made_db, timeout=0.1, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")  # rocprofv3 still writing
    try:
        err = refused(made_db, capsys)
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert "locked" in err and "nsys" not in err


def test_rocprof_v1_outputs_are_named_and_refused(tmp_path: Path, capsys) -> None:
    """Session 53: a ROCm blog's rocprof v1 --hip-trace outputs were refused as "not an Nsight
    Systems export" (its results.db: tables HIP, OPS, COPY, KERN) and "not a PyTorch profiler
    (Kineto) trace" (its results.json, a Chrome trace). Each now says what it is and what to
    record instead."""
    db = tmp_path / "results.db"
    con = sqlite3.connect(db)
    for table in ("HIP", "OPS", "COPY", "KERN"):
        con.execute(f'CREATE TABLE "{table}" (Index_ INTEGER, Name TEXT, BeginNs INTEGER, EndNs INTEGER)')  # fmt: skip
    con.commit()
    con.close()
    err = refused(db, capsys)
    assert "rocprof v1/v2 output (its database: tables COPY, HIP, KERN, OPS)" in err
    assert "record with rocprofv3" in err
    doc = tmp_path / "results.json"
    doc.write_text(
        '{ "traceEvents":[{}\n,{"args":{"name":"CPU HIP API"},"ph":"M","pid":2,"name":"process_name"}'
        '\n,{"ph":"X","name":"CopyHostToDevice","pid":"1","tid":"1","ts":"773902396463","dur":"8",'
        '"args":{"BeginNs":"773902396463126","EndNs":"773902396471606"}}]}'
    )
    err = refused(doc, capsys)
    assert "rocprof v1/v2 output (a --hip-trace Chrome trace)" in err
