"""FLOPs and bytes of one host op from its recorded shapes (``record_shapes``: Kineto's ``Input
Dims``, ``Input type`` and ``Concrete Inputs``), as pure functions of the op's name and args.

Conventions follow ``torch.utils.flop_counter`` (a multiply-add is 2 FLOPs; bias adds are not
counted), except that a causal attention mask halves the attention work: flash, memory-efficient
and cuDNN kernels skip the masked blocks. Applied to each DISTINCT (name, dims, types, concrete)
combination of a trace (a few hundred), never per op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import polars as pl

DTYPE_BYTES = {
    "double": 8,
    "float": 4,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
DTYPE_NAMES = {"double": "fp64", "float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16"}
# the backward of flash/efficient/cuDNN attention: 5 matmuls of the forward's 2 (S recomputed)
ATTENTION_BACKWARD_RATIO = 2.5

# attention ops: index of the query, layout of q/k/v, index of is_causal (or custom_mask_type)
ATTENTION: dict[str, tuple[int, str, int, bool]] = {
    # name: (query index, "bhsd" | "bshd", causal index, backward)
    "aten::scaled_dot_product_attention": (0, "bhsd", 5, False),
    "aten::_scaled_dot_product_flash_attention": (0, "bhsd", 4, False),
    "aten::_scaled_dot_product_efficient_attention": (0, "bhsd", 6, False),
    "aten::_scaled_dot_product_cudnn_attention": (0, "bhsd", 6, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, "bhsd", 4, False),
    "aten::_flash_attention_forward": (0, "bshd", 8, False),
    "aten::_efficient_attention_forward": (0, "bshd", 9, False),
    "aten::_cudnn_attention_forward": (0, "bhsd", 10, False),
    "aten::_scaled_dot_product_flash_attention_backward": (1, "bhsd", 11, True),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, "bhsd", 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, "bhsd", 14, True),
    "aten::_cudnn_attention_backward": (1, "bhsd", 14, True),
    "aten::_flash_attention_backward": (1, "bshd", 11, True),
    "aten::_efficient_attention_backward": (1, "bshd", 14, True),
}
# convolutions: index of stride, padding, dilation, transposed, groups (-1: not an argument)
CONV: dict[str, tuple[int, int, int, int, int]] = {
    "aten::convolution": (3, 4, 5, 6, 8),
    "aten::_convolution": (3, 4, 5, 6, 8),
    "aten::conv1d": (3, 4, 5, -1, 6),
    "aten::conv2d": (3, 4, 5, -1, 6),
    "aten::conv3d": (3, 4, 5, -1, 6),
    "aten::cudnn_convolution": (3, 2, 4, -1, 5),
    "aten::miopen_convolution": (4, 3, 5, -1, 6),
    "aten::mkldnn_convolution": (4, 3, 5, -1, 6),
    "aten::cudnn_convolution_transpose": (4, 2, 5, 99, 6),
}
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
REDUCTIONS = (
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "norm",
    "var",
    "std",
    "prod",
    "all",
    "any",
)


@dataclass(frozen=True)
class OpCost:
    flops: float | None = None  # None: no formula for this op
    bytes: float | None = None  # bytes read and written (inputs + outputs), where estimable
    kind: str | None = None  # "gemm" | "attention" | "conv" | "memory" (elementwise/reduction)
    dtype: str | None = None  # "bf16", "fp16", "fp32", "fp64" or the recorded type name
    m: int | None = None  # GEMM sizes (output m x n, inner k) for the alignment check
    n: int | None = None
    k: int | None = None
    # an elementwise/reduction op's work for the roofline only (1 FLOP per element of its
    # largest operand); never in flops_per_step or MFU, which count the model's math
    memory_flops: float | None = None


COST_SCHEMA: dict[str, pl.DataType] = {
    "flops": pl.Float64(),
    "bytes": pl.Float64(),
    "formula": pl.String(),
    "dtype": pl.String(),
    "gemm_m": pl.Int64(),
    "gemm_n": pl.Int64(),
    "gemm_k": pl.Int64(),
    "memory_flops": pl.Float64(),
}


def json_list(text: str | None) -> list[Any]:
    """A recorded argument list (``Input Dims``, ``Input type``, ...) from its JSON text; empty
    where it is absent or not a JSON list."""
    if not text:
        return []
    try:
        v = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    return v if isinstance(v, list) else []


def _dims(dims: list[Any], i: int) -> list[int] | None:
    if i >= len(dims) or not isinstance(dims[i], list) or not dims[i]:
        return None
    d = dims[i]
    return d if all(isinstance(x, int) for x in d) else None


def _ints(concrete: list[Any], i: int) -> list[int] | None:
    """A list argument recorded as text, "[2, 2]"; a single int as one element."""
    if i < 0 or i >= len(concrete) or not isinstance(concrete[i], str) or not concrete[i]:
        return None
    s = concrete[i].strip()
    try:
        v = orjson.loads(s) if s.startswith("[") else [int(s)]
    except (orjson.JSONDecodeError, ValueError):
        return None
    return (
        [int(x) for x in v] if isinstance(v, list) and all(isinstance(x, int) for x in v) else None
    )


def _flag(concrete: list[Any], i: int) -> bool:
    if i < 0 or i >= len(concrete):
        return False
    v = str(concrete[i]).strip()
    return v == "True" or (v.isdigit() and int(v) != 0)  # custom_mask_type 1/2: causal


def _numel(d: Sequence[int]) -> int:
    return math.prod(d) if d else 1


def _dtype(types: list[Any], i: int = 0) -> str | None:
    t = types[i] if i < len(types) and isinstance(types[i], str) else None
    if not t:
        return None
    if "Float8" in t:
        return "fp8"
    return DTYPE_NAMES.get(t, t)


def _size(types: list[Any], i: int) -> int:
    t = types[i] if i < len(types) else ""
    if isinstance(t, str) and "Float8" in t:
        return 1
    return DTYPE_BYTES.get(t, 0) if isinstance(t, str) else 0


def gemm_cost(name: str, dims: list[Any], types: list[Any]) -> OpCost | None:
    """mm/addmm/bmm/baddbmm/matmul/linear: 2·batch·m·n·k."""
    first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
    a, b = _dims(dims, first), _dims(dims, first + 1)
    if a is None or b is None:
        return None
    if name == "aten::linear":  # input [..., k], weight [n, k]
        if len(b) != 2:
            return None
        k, n = a[-1], b[0]
        m, batch = _numel(a[:-1]), 1
    else:
        if len(a) == 1:
            a = [1, *a]
        if len(b) == 1:
            b = [*b, 1]
        m, k, n = a[-2], a[-1], b[-1]
        batch = max(_numel(a[:-2]), _numel(b[:-2]))
    elem = _size(types, first) or 2
    nbytes = batch * (m * k + k * n + m * n) * elem
    return OpCost(2.0 * batch * m * n * k, float(nbytes), "gemm", _dtype(types, first), m, n, k)


def attention_cost(
    name: str, dims: list[Any], types: list[Any], concrete: list[Any]
) -> OpCost | None:
    """Attention: 4·b·h·s_q·s_k·d forward (QKᵀ and PV), 2.5x that backward; causal halves."""
    qi, layout, ci, backward = ATTENTION[name]
    q, k = _dims(dims, qi), _dims(dims, qi + 1)
    if q is None or k is None or len(q) != 4 or len(k) != 4:
        return None
    if layout == "bhsd":
        b, h, sq, d = q
        sk = k[2]
    else:
        b, sq, h, d = q
        sk = k[1]
    flops = 4.0 * b * h * sq * sk * d
    if _flag(concrete, ci):
        flops *= 0.5
    if backward:
        flops *= ATTENTION_BACKWARD_RATIO
    elem = _size(types, qi) or 2
    # q, k, v read, o written (backward: also dO read, dQ/dK/dV written)
    nbytes = (2 * b * h * sq * d + 2 * b * h * sk * d) * elem * (2 if backward else 1)
    return OpCost(flops, float(nbytes), "attention", _dtype(types, qi))


def conv_cost(name: str, dims: list[Any], types: list[Any], concrete: list[Any]) -> OpCost | None:
    """Convolution forward: 2·N·C_out·prod(out)·(C_in/groups)·prod(kernel); the output size
    from stride, padding and dilation where recorded (else stride 1, "same" padding)."""
    x, w = _dims(dims, 0), _dims(dims, 1)
    if x is None or w is None or len(x) < 3 or len(w) != len(x):
        return None
    si, pi, di, ti, gi = CONV[name]
    nsp = len(x) - 2
    stride = _ints(concrete, si) or [1]
    pad = _ints(concrete, pi)
    dil = _ints(concrete, di) or [1]
    transposed = ti == 99 or _flag(concrete, ti)
    ks = w[2:]
    if transposed:  # weight [C_in, C_out/groups, k...]: the work of the forward it inverts
        flops = 2.0 * x[0] * _numel(x[2:]) * w[0] * w[1] * _numel(ks)
        out_numel = x[0] * w[1] * _numel(x[2:])
    else:
        out = []
        for i in range(nsp):
            s = stride[i] if i < len(stride) else stride[-1]
            dl = dil[i] if i < len(dil) else dil[-1]
            p = (pad[i] if i < len(pad) else pad[-1]) if pad else (dl * (ks[i] - 1)) // 2
            out.append(max(0, (x[2 + i] + 2 * p - dl * (ks[i] - 1) - 1) // s + 1))
        flops = 2.0 * x[0] * w[0] * _numel(out) * w[1] * _numel(ks)
        out_numel = x[0] * w[0] * _numel(out)
    elem = _size(types, 0) or 2
    nbytes = (_numel(x) + _numel(w) + out_numel) * elem
    return OpCost(flops, float(nbytes), "conv", _dtype(types, 0))


def conv_backward_cost(dims: list[Any], types: list[Any], concrete: list[Any]) -> OpCost | None:
    """convolution_backward(grad_output, input, weight, ...): the input gradient and the weight
    gradient each cost one forward (output_mask says which were computed)."""
    go, x, w = _dims(dims, 0), _dims(dims, 1), _dims(dims, 2)
    if go is None or x is None or w is None or len(w) != len(x):
        return None
    transposed = _flag(concrete, 7)
    if transposed:
        fwd = 2.0 * x[0] * _numel(x[2:]) * w[0] * w[1] * _numel(w[2:])
    else:
        fwd = 2.0 * go[0] * go[1] * _numel(go[2:]) * w[1] * _numel(w[2:])
    mask = concrete[10] if len(concrete) > 10 and isinstance(concrete[10], str) else ""
    parts = [p.strip() for p in mask.strip("[]").split(",")]
    n = (parts[0] == "True") + (parts[1] == "True") if len(parts) >= 2 else 2  # not recorded: both
    elem = _size(types, 0) or 2
    nbytes = (2 * _numel(go) + 2 * _numel(x) + 2 * _numel(w)) * elem
    return OpCost(fwd * n, float(nbytes), "conv", _dtype(types, 0))


def einsum_cost(dims: list[Any], types: list[Any], concrete: list[Any]) -> OpCost | None:
    """einsum of two operands with the equation recorded: 2 x the product of every index size."""
    eq = concrete[0] if concrete and isinstance(concrete[0], str) else ""
    ops = dims[1] if len(dims) > 1 and isinstance(dims[1], list) else None
    if "->" not in eq or not ops or len(ops) != 2:
        return None
    lhs = eq.replace(" ", "").split("->")[0].split(",")
    if len(lhs) != 2 or "." in eq:
        return None
    sizes: dict[str, int] = {}
    for sub, shape in zip(lhs, ops, strict=False):
        if not isinstance(shape, list) or len(shape) != len(sub):
            return None
        sizes.update(zip(sub, shape, strict=True))
    return OpCost(2.0 * _numel(list(sizes.values())), None, "gemm", _dtype(types, 1))


# ops that only write their first argument (self) or copy their second into it: the tensor
# they fill is not read, and a copy writes its destination in its own dtype (audit 23: a
# fp32 -> bf16 cast counted as 10 bytes an element, not 6, read at 4.98 TB/s on a 3.35 TB/s H100)
WRITE_ONLY_OPS = ("aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_")
COPY_OPS = ("aten::copy_",)
# a row gather: reads the rows its indices pick, not the whole table (audit 23: an embedding
# of a 311 MB vocabulary table over 12 TB/s)
GATHER_OPS = {"aten::embedding": (0, 1, 0), "aten::index_select": (0, 2, None)}


def _gather_cost(
    name: str, dims: list[Any], types: list[Any], concrete: list[Any]
) -> OpCost | None:
    """A gather's bytes: the indices read, the picked rows read and written."""
    table_i, index_i, dim = GATHER_OPS[name]
    table, index = _dims(dims, table_i), _dims(dims, index_i)
    if table is None or index is None:
        return None
    if dim is None:
        picked = _ints(concrete, 1)
        dim = picked[0] if picked else 0
    if not -len(table) <= dim < len(table) or table[dim] <= 0:
        return None
    row = _numel(table) // table[dim]
    moved = _numel(index) * row * _size(types, table_i)
    if moved <= 0:
        return None
    read_index = _numel(index) * _size(types, index_i)
    return OpCost(
        None,
        float(read_index + 2 * moved),
        "memory",
        _dtype(types, table_i),
        memory_flops=float(_numel(index) * row),
    )


def memory_cost(name: str, dims: list[Any], types: list[Any]) -> OpCost | None:
    """An elementwise or reduction op's bytes: its tensor inputs read, and an output the size
    of the largest input written (a reduction's output is small: not counted); a fill writes
    its tensor only, a copy reads its source and writes its destination."""
    if name in WRITE_ONLY_OPS or name in COPY_OPS:
        d0 = _dims(dims, 0)
        n0 = _numel(d0) * _size(types, 0) if d0 is not None else 0
        d1 = _dims(dims, 1) if name in COPY_OPS else None
        n1 = _numel(d1) * _size(types, 1) if d1 is not None else 0
        if n0 <= 0 or (name in COPY_OPS and n1 <= 0):
            return None
        elements = float(_numel(d0)) if d0 is not None else 0.0
        return OpCost(None, float(n0 + n1), "memory", _dtype(types, 0), memory_flops=elements)
    shapes = [
        (_numel(d), _size(types, i))
        for i, d in enumerate(dims)
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d)
    ]
    shapes = [(n, b) for n, b in shapes if n * b > 0]
    if not shapes:
        return None
    sizes = [n * b for n, b in shapes]
    base = name.rsplit("::", 1)[-1].strip("_")
    out = 0 if base in REDUCTIONS else max(sizes)
    elements = float(max(n for n, _ in shapes))
    return OpCost(None, float(sum(sizes) + out), "memory", _dtype(types, 0), memory_flops=elements)


def op_cost(
    name: str, dims_text: str | None, types_text: str | None, concrete_text: str | None
) -> OpCost:
    """The FLOPs and bytes of one op (empty :class:`OpCost` where there is no formula)."""
    dims, types, concrete = json_list(dims_text), json_list(types_text), json_list(concrete_text)
    cost: OpCost | None = None
    if name in GEMM_OPS:
        cost = gemm_cost(name, dims, types)
    elif name in ATTENTION:
        cost = attention_cost(name, dims, types, concrete)
    elif name in CONV:
        cost = conv_cost(name, dims, types, concrete)
    elif name in ("aten::convolution_backward", "aten::miopen_convolution_backward"):
        cost = conv_backward_cost(dims, types, concrete)
    elif name == "aten::einsum":
        cost = einsum_cost(dims, types, concrete)
    elif name in GATHER_OPS:
        cost = _gather_cost(name, dims, types, concrete)
    elif name.startswith("aten::"):
        cost = memory_cost(name, dims, types)
    return cost or OpCost()


def op_costs(distinct: pl.DataFrame) -> pl.DataFrame:
    """``distinct`` (name, input_dims, input_types, concrete_inputs; one row per combination)
    with :data:`COST_SCHEMA`'s columns added."""
    rows = [
        op_cost(*r)
        for r in distinct.select("name", "input_dims", "input_types", "concrete_inputs").iter_rows()
    ]
    costs = pl.DataFrame(
        {
            "flops": [c.flops for c in rows],
            "bytes": [c.bytes for c in rows],
            "formula": [c.kind for c in rows],
            "dtype": [c.dtype for c in rows],
            "gemm_m": [c.m for c in rows],
            "gemm_n": [c.n for c in rows],
            "gemm_k": [c.k for c in rows],
            "memory_flops": [c.memory_flops for c in rows],
        },
        schema=COST_SCHEMA,
    )
    return pl.concat([distinct, costs], how="horizontal")
