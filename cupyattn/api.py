"""The public entry points: validate, plan, compile (cached), launch."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import struct
from typing import NamedTuple

import numpy as np

from . import tma
from .compile import get_kernel
from .device import current_device, smem_limit_from_env
from .launch import Launcher, pack
from .plan import (
    CXX_TYPES,
    MAX_HEAD_DIM,
    AttentionProblem,
    BwdDeltaWgmmaHalfConfig,
    MmaConfig,
    parse_precision,
    plan_backward,
    plan_forward,
)
from .plan.policy import resolve_policy
from .reference import causal_offset as _causal_offset
from .tma import describable as _tma_describable

LAYOUTS = ("bshd", "bhsd")


@functools.cache
def _device_spec(device_id: int):
    return current_device(device_id)


def _dtype_name(x) -> str:
    return np.dtype(x.dtype).name


def _as_cupy(name: str, x):
    """A zero-copy CuPy view of a foreign GPU array (anything with ``__dlpack__`` or
    ``__cuda_array_interface__``: torch tensors, JAX arrays, Numba arrays); CuPy and
    NumPy arrays and None pass through unchanged (NumPy is refused later, clearly).

    DLPack is asked first: CuPy hands its current stream to the producer, which orders
    its pending work on that array before it (the DLPack stream protocol).
    ``__cuda_array_interface__`` v3 producers name their stream and CuPy waits on it.
    """
    import cupy

    if x is None or isinstance(x, (cupy.ndarray, np.ndarray)):
        return x
    problems = []
    if hasattr(x, "__dlpack__"):
        try:
            return cupy.from_dlpack(x)
        except Exception as exc:  # e.g. a host tensor, or a dtype this CuPy cannot import
            problems.append(f"DLPack: {exc}")
    if hasattr(x, "__cuda_array_interface__"):
        try:
            return cupy.asarray(x)
        except Exception as exc:
            problems.append(f"__cuda_array_interface__: {exc}")
    if problems:
        raise TypeError(
            f"{name}: could not view {type(x).__module__}.{type(x).__name__} as a GPU array "
            f"without copying ({'; '.join(problems)})"
        )
    return x


def _require_cupy(name: str, x):
    import cupy

    if isinstance(x, np.ndarray):
        raise TypeError(
            f"{name}: expected a cupy.ndarray in GPU memory, got a numpy.ndarray "
            f"(host memory); move it with cupy.asarray({name})"
        )
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name}: expected a cupy.ndarray, got {type(x).__module__}.{type(x).__name__}")


def _to_bshd(x, layout):
    return x.transpose(0, 2, 1, 3) if layout == "bhsd" else x


def _check_last_dim_contiguous(name: str, x):
    if x.size > 0 and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        raise ValueError(
            f"{name}: expected a contiguous last dimension (stride {x.itemsize} bytes), "
            f"got stride {x.strides[-1]} bytes; pass {name}.copy() or a view with "
            "contiguous rows"
        )


def _elem_strides(x) -> tuple[int, int, int]:
    """(batch, seq, head) strides in elements of a (B, S, H, D) view."""
    return tuple(np.int64(s // x.itemsize) for s in x.strides[:3])


def _rows_16_byte_aligned(x) -> bool:
    """Every (b, s, h) row of a (B, S, H, D) view starts on a 16-byte boundary."""
    return x.data.ptr % 16 == 0 and all(st % 16 == 0 for st, n in zip(x.strides[:3], x.shape[:3]) if n > 1)


def _ptr(x):
    # Raw pointers: CuPy need not know the dtype (bfloat16 comes from ml_dtypes).
    return np.uint64(x.data.ptr)


def _zero_fill(x):
    x.view(f"u{x.itemsize}").fill(0)  # all-zero bits are 0.0 in every supported dtype


def round_operand(x, mode: str):
    """``x`` (a float32 CuPy array) rounded as the tensor cores' operands of ``mode``
    are: "tf32" to nearest, ties away (cvt.rna), "bf16" / "fp16" to nearest even; a new
    C-contiguous float32 array (non-finite values kept). reference.round_to is the NumPy
    twin the tests hold it to."""
    import cupy

    if mode == "fp16":
        return x.astype(cupy.float16).astype(cupy.float32)
    bits = cupy.ascontiguousarray(x).view(cupy.uint32)
    if mode == "tf32":
        rounded = (bits + cupy.uint32(0x1000)) & cupy.uint32(0xFFFFE000)
    elif mode == "bf16":
        rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) & cupy.uint32(0xFFFF0000)
    else:
        raise ValueError(f"mode: expected tf32, bf16 or fp16, got {mode!r}")
    return cupy.where(cupy.isfinite(x), rounded.view(cupy.float32), x)


def _operands_for(plan, arrays):
    """The arrays a launch of ``plan`` reads: as given, but for a CUDA-core (FFMA) pass in
    a mode that rounds operands ("tf32", "bf16", "fp16"), rounded copies, so that it sees
    the scores a tensor-core pass of that mode does: a backward's P = exp(s - lse) takes
    the forward's lse, and a forward on tensor cores with a backward pass on CUDA cores
    (or the reverse) would otherwise mix scores of two precisions."""
    if plan.problem.dtype != "float32" or plan.precision == "fp32" or isinstance(plan.config, MmaConfig):
        return arrays
    return tuple(round_operand(x, plan.precision) for x in arrays)


def _parse_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite real number, got {scale!r}")
    return float(scale)


LOG2E = 1.4426950408889634


class Shapes(NamedTuple):
    """A call's sizes and options as ``check_shapes`` finds them."""

    dtype: str
    B: int
    Sq: int
    Sk: int
    Hq: int
    Hkv: int
    D: int
    Dv: int
    causal_offset: int | None
    scale: float
    precision: tuple[str, ...]


@dataclasses.dataclass
class _Call:
    """Validated q, k, v as (B, S, H, D) views, with the problem they pose."""

    qs: object
    ks: object
    vs: object
    layout: str
    device_id: int
    shapes: Shapes  # dtype, sizes and options, read through as the call's own (call.B, ...)

    def __getattr__(self, name):
        return getattr(self.shapes, name)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """Shape of out / dout / dq-like arrays in the caller's layout (head dim Dv)."""
        if self.layout == "bhsd":
            return (self.B, self.Hq, self.Sq, self.Dv)
        return (self.B, self.Sq, self.Hq, self.Dv)

    @property
    def sizes(self) -> tuple:
        """Hq, Hkv, Sq, Sk, D, Dv as the kernels take them (int32)."""
        return tuple(np.int32(n) for n in (self.Hq, self.Hkv, self.Sq, self.Sk, self.D, self.Dv))

    def shape_like(self, which: str) -> tuple[int, ...]:
        """Caller-layout shape of an array shaped like q, k or v."""
        B, S, H, D = {
            "q": (self.B, self.Sq, self.Hq, self.D),
            "k": (self.B, self.Sk, self.Hkv, self.D),
            "v": (self.B, self.Sk, self.Hkv, self.Dv),
        }[which]
        return (B, H, S, D) if self.layout == "bhsd" else (B, S, H, D)

    def problem(self, *others, deterministic: bool = True) -> AttentionProblem:
        """The planning problem; ``others`` (e.g. out) join q, k, v in the alignment check."""
        arrays = (self.qs, self.ks, self.vs) + tuple(self.bshd(x) for x in others)
        return AttentionProblem(
            self.dtype,
            self.D,
            self.Dv,
            self.causal_offset is not None,
            self.B,
            self.Hq,
            self.Hkv,
            self.Sq,
            self.Sk,
            aligned=all(_rows_16_byte_aligned(x) for x in arrays),
            tma=all(_tma_describable(x) for x in arrays),
            precision=self.precision,
            deterministic=deterministic,
        )

    def bshd(self, x):
        return _to_bshd(x, self.layout)


def check_shapes(q_shape, k_shape, v_shape, dtypes, *, causal, scale, layout, precision=None) -> Shapes:
    """What ``attention`` checks of q, k, v that needs no array: their shapes (in ``layout``)
    and dtype names, and the options, with ``attention``'s errors (a framework that stages
    calls checks them here when the call is traced)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    shapes = tuple(tuple(int(n) for n in shape) for shape in (q_shape, k_shape, v_shape))
    for name, shape, dtype in zip(("q", "k", "v"), shapes, dtypes):
        if len(shape) != 4:
            raise ValueError(
                f"{name}: expected 4 dimensions (batch, seqlen, heads, head_dim), got {len(shape)} with shape {shape}"
            )
        if dtype not in CXX_TYPES:
            raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {dtype}")
    dtype = dtypes[0]
    for name, other in (("k", dtypes[1]), ("v", dtypes[2])):
        if other != dtype:
            raise TypeError(f"{name}: expected dtype {dtype} (the dtype of q), got {other}")
    qs, ks, vs = (s if layout == "bshd" else (s[0], s[2], s[1], s[3]) for s in shapes)
    B, Sq, Hq, D = qs
    _, Sk, Hkv, Dv = vs
    if ks[0] != B or vs[0] != B:
        raise ValueError(f"k, v: expected batch {B} (the batch of q), got k {ks[0]}, v {vs[0]}")
    if ks[1] != Sk or ks[2] != Hkv:
        raise ValueError(
            f"k, v: expected the same seqlen and heads, got k {shapes[1]} and v {shapes[2]} (layout {layout!r})"
        )
    if ks[3] != D:
        raise ValueError(f"k: expected head_dim {D} (the head_dim of q), got {ks[3]}")
    for name, d in (("q", D), ("v", Dv)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: expected head_dim 1..{MAX_HEAD_DIM}, got {d}")
    if (Hkv == 0 and Hq != 0) or (Hkv != 0 and Hq % Hkv != 0):
        raise ValueError(f"k, v: expected a number of heads that divides the {Hq} heads of q, got {Hkv}")
    offset = _causal_offset(causal, Sq, Sk)
    return Shapes(dtype, B, Sq, Sk, Hq, Hkv, D, Dv, offset, _parse_scale(scale, D), parse_precision(precision, dtype))


def _validate(q, k, v, causal, scale, layout, precision=None) -> _Call:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _require_cupy(name, x)
    dtypes = tuple(_dtype_name(x) for x in (q, k, v))
    shapes = check_shapes(
        q.shape, k.shape, v.shape, dtypes, causal=causal, scale=scale, layout=layout, precision=precision
    )
    for name, x in (("k", k), ("v", v)):
        if x.device.id != q.device.id:
            raise ValueError(
                f"{name}: expected an array on device {q.device.id} (the device of q), got device {x.device.id}"
            )
    qs, ks, vs = (_to_bshd(x, layout) for x in (q, k, v))
    for name, x in (("q", qs), ("k", ks), ("v", vs)):
        _check_last_dim_contiguous(name, x)
    return _Call(qs, ks, vs, layout, q.device.id, shapes)


def _check_like(name: str, x, shape, dtype: str, device_id: int, c_contiguous: bool = False):
    """A caller's array (out=, dout, dq=, ...): CuPy, shape, dtype, device, contiguous rows
    (or wholly C-contiguous)."""
    _require_cupy(name, x)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if _dtype_name(x) != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {_dtype_name(x)}")
    if x.device.id != device_id:
        raise ValueError(f"{name}: expected an array on device {device_id} (the device of q), got device {x.device.id}")
    if c_contiguous and x.size and not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, as attention() returns it, got strides {x.strides}")
    _check_last_dim_contiguous(name, x)


def _output(name: str, given, shape, call: _Call):
    """A caller's output array after checking it, or a new one of q's dtype."""
    import cupy

    if given is None:
        return cupy.empty(shape, dtype=call.qs.dtype)
    _check_like(name, given, shape, call.dtype, call.device_id)
    return given


def _device_for(call: _Call, smem_limit):
    limit = smem_limit if smem_limit is not None else smem_limit_from_env()
    return _device_spec(call.device_id).with_smem_limit(limit)


# The backward's dQ pass on a second stream beside the dK/dV pass (see attention_backward).
OVERLAP_DQ = True
_SIDE_STREAMS = {}


def _side_stream(device_id: int):
    """One non-blocking stream per device for work beside the caller's stream (joined to
    it with events, so no implicit synchronization with the legacy default stream)."""
    import cupy

    if device_id not in _SIDE_STREAMS:
        _SIDE_STREAMS[device_id] = cupy.cuda.Stream(non_blocking=True)
    return _SIDE_STREAMS[device_id]


def _check_grid(blocks: int, what: str):
    if blocks >= 2**31:
        raise ValueError(f"{what}: {blocks} blocks exceed the grid limit of 2**31 - 1")


def _launch(config, spec, blocks: int, what: str, args, smem: int = 0):
    """Launch ``config``'s kernel on the current device and stream."""
    import cupy

    _check_grid(blocks, what)
    data, offsets = pack(args)
    launcher = Launcher(get_kernel(config, spec).kernel.ptr, blocks, config.threads, smem, offsets, len(data))
    _launch_packed(config, launcher, cupy.cuda.get_current_stream().ptr, data)


def _launch_packed(config, launcher: Launcher, stream: int, data: bytes) -> None:
    """Every launch's last step: ``config``'s kernel with its arguments packed."""
    launcher(stream, data)


def stage_tiles(staging, spec, a, b, out=None, lse=None, delta=None):
    """The TF32 tiles a wgmma kernel copies whole (``plan.StagingConfig``), as a new flat
    float32 array of ``staging.workspace_bytes`` bytes: from K and V ((B, Sk, Hkv, D)
    float32 views, last dimension contiguous) for "forward keys" and "dq keys"; from Q and
    dO ((B, Sq, Hq, D)) for "dkdv queries", with the output O (as dO) and lse ((B, Hq, Sq)),
    which also writes delta = rowsum(dO * O) ((B, Hq, Sq), as attn_bwd_delta)."""
    import cupy

    B, S, H, D = a.shape
    staged = cupy.empty(staging.workspace_bytes(B, H, S) // 4, dtype=cupy.float32)
    tiles = staging.tiles(S)
    queries = staging.queries
    rowwise = (_ptr(out), _ptr(lse), _ptr(delta)) if queries else ()
    _launch(
        staging,
        spec,
        tiles * B * H,
        "q" if queries else "k",
        (
            _ptr(a),
            _ptr(b),
            *rowwise,
            _ptr(staged),
            *_elem_strides(a),
            *_elem_strides(b),
            *(_elem_strides(out) if queries else ()),
            np.int32(H),
            np.int32(S),
            np.int32(D),
            np.int32(tiles),
        ),
    )
    return staged


@dataclasses.dataclass(frozen=True)
class ForwardLaunch:
    """One planned forward kernel launch, all of it but the arrays' addresses: a call with
    arrays of the same shapes, strides, dtypes, alignments and device, and the same options,
    repeats it without validating or planning again (``forward_key``)."""

    device_id: int
    config: object  # the plan's kernel configuration
    launcher: Launcher
    out_shape: tuple
    lse_shape: tuple
    sizes: bytes  # the packed arguments between the five pointers and the staged tiles / TMA maps
    staged: bool  # the last argument is the staged tiles' pointer
    maps: tuple  # or the TMA maps of q, k, v: (shape, byte strides, box rows) of each (B, S, H, D) view
    dtype: str

    @classmethod
    def of(cls, plan, spec, call: _Call, qs, ks, vs, os_) -> ForwardLaunch:
        cfg = plan.config
        num_m_tiles = -(-call.Sq // cfg.block_m)
        blocks = num_m_tiles * call.B * call.Hq
        _check_grid(blocks, "q")
        sizes, offsets = pack(
            (
                *_elem_strides(qs),
                *_elem_strides(ks),
                *_elem_strides(vs),
                *_elem_strides(os_),
                *call.sizes,
                np.int32(num_m_tiles),
                np.float32(call.scale * LOG2E),
                np.int32(call.causal_offset or 0),
            )
        )
        staged = getattr(cfg, "staging", None) is not None
        maps = ()
        if getattr(cfg, "TMA_MAPS", False):  # the wgmma forward of float16 / bfloat16: q, k, v by TMA
            rows = (cfg.block_m, cfg.block_n, cfg.block_n)
            maps = tuple((tuple(map(int, x.shape)), tuple(map(int, x.strides)), r) for x, r in zip((qs, ks, vs), rows))
        pointers = 5 * 8
        last = (pointers + len(sizes),) if staged or maps else ()
        offsets = (0, 8, 16, 24, 32, *(pointers + o for o in offsets), *last)
        size = pointers + len(sizes) + (8 if staged else 3 * 128 if maps else 0)
        function = get_kernel(cfg, spec).kernel.ptr
        return cls(
            call.device_id,
            cfg,
            Launcher(function, blocks, cfg.threads, plan.smem_bytes, offsets, size),
            call.out_shape,
            (call.B, call.Hq, call.Sq),
            sizes,
            staged,
            maps,
            call.dtype,
        )

    def __call__(self, q: int, k: int, v: int, out: int, lse: int, stream: int, staged: int = 0) -> None:
        """Launch on ``stream`` with the arrays at these addresses ((B, S, H, D) views' bases;
        ``staged``: the staged tiles, for a launch that reads them)."""
        import cupy

        data = struct.pack("<5Q", q, k, v, out, lse) + self.sizes
        if self.maps:
            data += b"".join(tma.encode(p, *m, self.dtype).tobytes() for p, m in zip((q, k, v), self.maps))
        elif self.staged:
            data += struct.pack("<Q", staged)
        if cupy.cuda.runtime.getDevice() == self.device_id:
            _launch_packed(self.config, self.launcher, stream, data)
        else:
            with cupy.cuda.Device(self.device_id):
                _launch_packed(self.config, self.launcher, stream, data)


# Forward launches by ``forward_key``: what a repeated call reuses.
_FORWARD_LAUNCHES: dict = {}
_LAUNCHES_MAX = 4096  # (of each kind: a table this full starts again)


def _describe(x) -> tuple:
    """What a forward launch depends on of one CuPy array: its shape, strides, dtype, whether
    its address is 16-byte aligned, and its device."""
    data = x.data
    return (x.shape, x.strides, x.dtype, data.ptr % 16 == 0, data.device_id)


def forward_key(q, k, v, out, lse, *, causal, scale, layout, smem_limit, precision, policy) -> tuple:
    """The key of a forward call: q, k, v, out and lse described (each a tuple that fixes the
    array's shape, strides, dtype, 16-byte alignment and device, in a frontend's own terms; out
    and lse None when the frontend allocates them) and the options, causal and scale with
    their types (True and 1, or True and 1.0, are not the same option)."""
    env = os.environ.get("CUPYATTN_SMEM_LIMIT")
    return (q, k, v, out, lse, type(causal), causal, type(scale), scale, layout, smem_limit, precision, policy, env)


def _known(table: dict, key):
    try:
        return table.get(key)
    except TypeError:  # an unhashable option (a list of precision modes): never reused
        return None


def _remember(table: dict, key, launch) -> None:
    try:
        if len(table) >= _LAUNCHES_MAX:
            table.clear()
        table[key] = launch
    except TypeError:
        pass


def known_forward(key) -> ForwardLaunch | None:
    """The launch a call of this key made before, or None."""
    return _known(_FORWARD_LAUNCHES, key)


def remember_forward(key, forward: ForwardLaunch) -> None:
    _remember(_FORWARD_LAUNCHES, key, forward)


class _Address(str):
    """A kernel argument that is the address of one of a backward's arrays, by name: filled in
    at each call (``BackwardLaunch.run``)."""


@dataclasses.dataclass(frozen=True)
class _Maps:
    """A backward pass's ``BwdTmaMaps`` argument, made at each call from the addresses of its
    q, k, v and dout (by name), with their (shape, byte strides) and box rows."""

    names: tuple
    layouts: tuple
    rows: tuple
    dtype: str

    def packed(self, addresses: dict) -> bytes:
        return b"".join(
            tma.encode(addresses[name], shape, strides, rows, self.dtype).tobytes()
            for name, (shape, strides), rows in zip(self.names, self.layouts, self.rows)
        )


@dataclasses.dataclass(frozen=True)
class _Step:
    """One launch of a backward ("delta", "dkdv", "convert" or "dq"): its kernel, grid and
    arguments, packed but for the arrays' addresses (``pieces``: bytes, _Address or _Maps)."""

    name: str
    config: object
    launcher: Launcher
    pieces: tuple

    @classmethod
    def of(cls, name: str, config, spec, blocks: int, what: str, args, smem: int = 0) -> _Step:
        _check_grid(blocks, what)
        pieces, offsets, size = [], [], 0
        for arg in args:
            offsets.append(size)
            if isinstance(arg, (_Address, _Maps)):
                pieces.append(arg)
                size += 8 if isinstance(arg, _Address) else tma.BWD_TMA_MAPS.itemsize
                continue
            data, _ = pack((arg,))
            if pieces and isinstance(pieces[-1], bytes):
                pieces[-1] += data
            else:
                pieces.append(data)
            size += len(data)
        function = get_kernel(config, spec).kernel.ptr
        return cls(name, config, Launcher(function, blocks, config.threads, smem, tuple(offsets), size), tuple(pieces))

    def launch(self, addresses: dict, stream: int) -> None:
        data = b"".join(
            piece
            if isinstance(piece, bytes)
            else struct.pack("<Q", addresses[piece])
            if isinstance(piece, _Address)
            else piece.packed(addresses)
            for piece in self.pieces
        )
        _launch_packed(self.config, self.launcher, stream, data)


def _operand_names(plan) -> tuple:
    """Address names of the q, k, v and dout a backward pass reads (a CUDA-core pass may read
    copies rounded for it: _operands_for)."""
    tag = "mma" if isinstance(plan.config, MmaConfig) else "simt"
    return tuple(f"{name}:{tag}" for name in ("q", "k", "v", "dout"))


@dataclasses.dataclass(frozen=True)
class BackwardLaunch:
    """A backward's launches, all of them but the arrays' addresses and its workspace (delta,
    the fused pass's float32 dQ tiles and turn counters, made at each call): a call with arrays
    of the same shapes, strides, dtypes, alignments and device, and the same options, repeats
    them without validating or planning again (``backward_key``)."""

    device_id: int
    grad_shapes: tuple  # dq, dk, dv in the caller's layout
    dtype: object  # theirs (q's)
    operand_names: tuple  # the passes' q, k, v, dout address names (_operand_names)
    delta_shape: tuple
    padded_shape: tuple | None  # lse * log2(e) and delta rows padded to the dK/dV pass's tiles
    accum_shape: tuple | None  # the fused float16 / bfloat16 pass's dQ tiles
    ordered: bool  # and their turn counters
    zero_dq: bool  # the fused float32 pass adds dQ into dq itself
    steps: tuple

    @classmethod
    def of(cls, bplan, spec, call: _Call, arrays: dict) -> BackwardLaunch:
        """``bplan``'s launches for ``call``; ``arrays``: by address name, the (B, S, H, D)
        views the launches read and write ("dout", "out", "lse", "dq", "dk", "dv" and each
        pass's operands, _operand_names)."""
        A = _Address
        sizes = call.sizes
        tail = (np.float32(call.scale), np.float32(call.scale * LOG2E), np.int32(call.causal_offset or 0))
        strides = lambda *names: tuple(s for n in names for s in _elem_strides(arrays[n]))  # noqa: E731
        steps = []
        padded_shape = None  # the float16 / bfloat16 wgmma dK/dV pass's lse * log2(e) and delta rows
        if bplan.delta is not None:  # else the dK/dV pass's staging launch writes it
            rows = call.B * call.Hq * call.Sq
            outputs, tail_args = (A("delta"),), ()
            if isinstance(bplan.delta, BwdDeltaWgmmaHalfConfig):
                padded = bplan.delta.padded_rows(call.Sq)
                padded_shape, rows = (2, call.B, call.Hq, padded), call.B * call.Hq * padded
                outputs, tail_args = (A("lse"), A("delta"), A("lse_rows")), (np.int32(padded),)
            args = (A("dout"), A("out"), *outputs, *strides("dout", "out"), np.int32(call.Hq), np.int32(call.Sq))
            args += (np.int32(call.Dv), *tail_args, np.int64(rows))
            steps.append(_Step.of("delta", bplan.delta, spec, -(-rows // bplan.delta.rows_per_block), "dout", args))

        def reads(name, plan):
            """A pass's operand addresses with lse and delta, their strides, and its last
            argument: the staged tiles (float32 wgmma passes) or the TMA maps (float16 /
            bfloat16 wgmma passes)."""
            names, cfg = _operand_names(plan), plan.config
            last = ()
            if getattr(cfg, "staging", None) is not None:
                last = (A(f"staged:{name}"),)
            elif getattr(cfg, "TMA_MAPS", False):
                layouts = tuple((tuple(map(int, arrays[n].shape)), tuple(map(int, arrays[n].strides))) for n in names)
                last = (_Maps(names, layouts, (cfg.block_m, cfg.block_n, cfg.block_n, cfg.block_m), call.dtype),)
            row_names = ("lse_rows", "delta_rows") if name == "dkdv" and padded_shape is not None else ("lse", "delta")
            return (*map(A, names), *map(A, row_names)), strides(*names), last

        cfg = bplan.dkdv.config
        ptrs, operand_strides, last = reads("dkdv", bplan.dkdv)
        num_n_tiles = -(-call.Sk // cfg.block_n)
        fused, accum_shape, ordered, zero_dq = (), None, False, False
        if bplan.dq is None and bplan.dq_convert is None:  # float32: dQ added into dq itself
            fused, zero_dq = (A("dq"), *strides("dq")), True
        elif bplan.dq is None:  # float16 / bfloat16: into float32 tiles of 64 query rows
            accum_shape, ordered = cfg.accumulator_shape(call.B, call.Hq, call.Sq), cfg.ordered
            fused = (A("dq_accum"), A("turns"), np.int32(accum_shape[2]))
        args = (*ptrs, A("dk"), A("dv"), *operand_strides, *strides("dk", "dv"), *sizes, np.int32(num_n_tiles))
        args += (*tail, *last, *fused)
        blocks = num_n_tiles * call.B * call.Hkv
        steps.append(_Step.of("dkdv", cfg, spec, blocks, "k", args, bplan.dkdv.smem_bytes))
        if bplan.dq_convert is not None:  # dq = scale * the float32 tiles, rounded
            args = (A("dq_accum"), A("dq"), *strides("dq"), np.int32(call.Hq), np.int32(call.Sq), np.int32(call.D))
            args += (np.int32(cfg.d_chunks), np.float32(call.scale))
            steps.append(_Step.of("convert", bplan.dq_convert, spec, math.prod(accum_shape[:3]), "q", args))
        if bplan.dq is not None:
            cfg = bplan.dq.config
            ptrs, operand_strides, last = reads("dq", bplan.dq)
            num_m_tiles = -(-call.Sq // cfg.block_m)
            args = (*ptrs, A("dq"), *operand_strides, *strides("dq"), *sizes, np.int32(num_m_tiles), *tail, *last)
            steps.append(_Step.of("dq", cfg, spec, num_m_tiles * call.B * call.Hq, "q", args, bplan.dq.smem_bytes))
        names = tuple(dict.fromkeys(n for p in bplan.plans for n in _operand_names(p)))
        grads = (call.shape_like("q"), call.shape_like("k"), call.shape_like("v"))
        delta_shape = (call.B, call.Hq, call.Sq)
        return cls(
            call.device_id,
            grads,
            call.qs.dtype,
            names,
            delta_shape,
            padded_shape,
            accum_shape,
            ordered,
            zero_dq,
            tuple(steps),
        )

    def run(self, addresses: dict, prepare=None) -> None:
        """The launches on the current stream (the dQ pass beside them: OVERLAP_DQ), with the
        arrays at ``addresses`` (by name, as ``of`` took them) and the workspace made here.
        ``prepare``: by step name, a function of delta run on that step's stream before it,
        giving more arrays by address name (tiles staged for it)."""
        import cupy

        prepare = prepare or {}
        delta = cupy.empty(self.delta_shape, dtype=cupy.float32)
        keep = [delta]  # what this call makes stays referenced until its launches are queued
        addresses["delta"] = delta.data.ptr
        if self.padded_shape is not None:
            padded = cupy.empty(self.padded_shape, dtype=cupy.float32)
            keep.append(padded)
            addresses["lse_rows"], addresses["delta_rows"] = padded[0].data.ptr, padded[1].data.ptr
        if self.accum_shape is not None:
            accum = cupy.zeros(self.accum_shape, dtype=cupy.float32)
            turns = cupy.zeros(self.accum_shape[:3], dtype=cupy.int32) if self.ordered else None
            keep += [accum, turns]
            addresses["dq_accum"], addresses["turns"] = accum.data.ptr, 0 if turns is None else turns.data.ptr
        main = cupy.cuda.get_current_stream()
        overlap, ready = OVERLAP_DQ and any(step.name == "dq" for step in self.steps), None
        for step in self.steps:
            side = overlap and step.name == "dq"
            stream = _side_stream(self.device_id) if side else main
            if side:  # everything the dQ pass reads is ready (delta too): it runs beside dK/dV
                stream.wait_event(ready)
            # (arrays made on the side stream return to its pool, reused in its order; from
            # cupyattn.torch, to torch's pool of the caller's stream, which joins the side stream)
            with stream:
                if step.name in prepare:
                    made = prepare[step.name](delta)
                    keep.append(made)
                    addresses.update((name, x.data.ptr) for name, x in made.items())
                if step.name == "dkdv" and overlap:
                    ready = main.record()
                step.launch(addresses, stream.ptr)
            if side:
                main.wait_event(stream.record())  # the caller's stream sees dq, and later work follows it

    def __call__(self, dout, q, k, v, out, lse, dq, dk, dv) -> tuple:
        """The launches for arrays described as the first call's: (dq, dk, dv), made here
        where None."""
        import cupy

        assert not self.zero_dq, "a launch that zero-fills dq first is never repeated (backward_uncached)"
        with cupy.cuda.Device(self.device_id):
            dq, dk, dv = (
                cupy.empty(shape, dtype=self.dtype) if g is None else g
                for g, shape in zip((dq, dk, dv), self.grad_shapes)
            )
            given = {"q": q, "k": k, "v": v, "dout": dout}
            addresses = {n: given[n.split(":")[0]].data.ptr for n in self.operand_names}
            named = (("dout", dout), ("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv))
            addresses.update((name, x.data.ptr) for name, x in named)
            self.run(addresses)
        return dq, dk, dv


# Backward launches by ``backward_key``.
_BACKWARD_LAUNCHES: dict = {}


def backward_key(
    dout, q, k, v, out, lse, dq, dk, dv, *, causal, scale, layout, deterministic, smem_limit, precision, policy
) -> tuple:
    """The key of a backward call: its arrays described as ``forward_key``'s (dq, dk, dv None
    when the call makes them) and its options."""
    options = (type(causal), causal, type(scale), scale, layout, type(deterministic), deterministic)
    env = os.environ.get("CUPYATTN_SMEM_LIMIT")
    return (dout, q, k, v, out, lse, dq, dk, dv, *options, smem_limit, precision, policy, env)


def known_backward(key) -> BackwardLaunch | None:
    """The launches a call of this key made before, or None."""
    return _known(_BACKWARD_LAUNCHES, key)


def remember_backward(key, backward: BackwardLaunch) -> None:
    _remember(_BACKWARD_LAUNCHES, key, backward)


def attention(
    q,
    k,
    v,
    *,
    causal=False,
    scale=None,
    return_lse=False,
    out=None,
    lse=None,
    layout="bshd",
    smem_limit=None,
    precision=None,
    policy=None,
):
    """Exact attention ``softmax(scale * Q K^T) V`` with FlashAttention's tiled algorithm.

    Args:
        q: (B, Sq, Hq, D) CuPy array, float16, bfloat16 or float32; any strides
           with a contiguous last dimension (views of packed QKV work without copies).
           Any GPU array with ``__dlpack__`` or ``__cuda_array_interface__`` (a torch
           tensor, a JAX array) is viewed without a copy, for every array argument;
           results are CuPy arrays (with ``out=``, a view of the caller's memory).
        k: (B, Sk, Hkv, D), same dtype and device; Hq must be divisible by Hkv (GQA/MQA).
        v: (B, Sk, Hkv, Dv). Head dims 1..256.
        causal: False; True or "bottom_right" (query i sees key j iff j <= i + Sk - Sq,
           FlashAttention's convention); "top_left" (j <= i, PyTorch SDPA's is_causal).
        scale: softmax scale, default 1 / sqrt(D).
        return_lse: also return the log-sum-exp, (B, Hq, Sq) float32, natural log.
        lse: optional array the log-sum-exp is written to, (B, Hq, Sq) float32,
           C-contiguous (returned with ``return_lse``). Left untouched if validation fails.
        out: optional output array, (B, Sq, Hq, Dv) in ``layout``, q's dtype, last
           dimension contiguous. Left untouched if validation fails.
        layout: "bshd" (default) or "bhsd" for (B, H, S, D) arrays; out follows it.
        smem_limit: plan as if a block could use at most this many bytes of shared
           memory (``CUPYATTN_SMEM_LIMIT`` in the environment does the same).
        precision: for float32 inputs, how products are computed (float32 in and out,
           float32 accumulation and softmax in every mode; docs/precision.md has each
           mode's measured error):
           "fp32" (None, the default): float32 accuracy; 3xTF32 on tensor cores
           (sm_80+), FFMA on older GPUs. "tf32": one TF32 pass. "bf16" / "fp16":
           operands staged in shared memory as bfloat16 / float16 (half the bytes).
           A sequence, e.g. ("fp32", "bf16"), allows several: the planner takes the
           first that runs on tensor cores on this device, else the first (FFMA).
           float16 / bfloat16 inputs accept only None or their own mode.
        policy: a ``cupyattn.plan.Policy``: the kernel families, tiles and thresholds
           the planner may choose from (None: the default, as measured fastest).

    A query row that sees no key gets out = 0 and lse = -inf. A call whose arrays match an
    earlier call's in shape, strides, dtype, 16-byte alignment and device, with the same
    options, repeats that call's launch at the new addresses without validating or planning
    again (the host time of a small call: BENCHMARKS.md).
    """
    import cupy

    resolve_policy(policy)  # (a policy that is not one is refused first)
    named = (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse))
    q, k, v, out, lse = (_as_cupy(n, x) for n, x in named)
    options = dict(causal=causal, scale=scale, layout=layout, smem_limit=smem_limit, precision=precision, policy=policy)
    key = None
    if all(isinstance(x, cupy.ndarray) for x in (q, k, v)) and all(
        x is None or isinstance(x, cupy.ndarray) for x in (out, lse)
    ):
        key = forward_key(*(None if x is None else _describe(x) for x in (q, k, v, out, lse)), **options)
        known = known_forward(key)
        if known is not None:  # seen before: valid, planned, compiled
            with cupy.cuda.Device(known.device_id):
                out = cupy.empty(known.out_shape, dtype=q.dtype) if out is None else out
                lse = cupy.empty(known.lse_shape, dtype=cupy.float32) if lse is None else lse
                stream = cupy.cuda.get_current_stream().ptr
                known(q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, lse.data.ptr, stream)
            return (out, lse) if return_lse else out
    (out, lse), forward = forward_uncached(q, k, v, out, lse, **options)
    if key is not None and forward is not None:
        remember_forward(key, forward)
    return (out, lse) if return_lse else out


def forward_uncached(q, k, v, out, lse, *, causal, scale, layout, smem_limit, precision, policy):
    """``attention``'s work from validation to launch, for CuPy arrays: ((out, lse), the
    ``ForwardLaunch`` a later call with arrays described alike may repeat, or None where the
    launch read more than q, k, v (tiles staged for it, operands rounded for it) or none
    happened)."""
    import cupy

    call = _validate(q, k, v, causal, scale, layout, precision)
    with cupy.cuda.Device(call.device_id):
        out = _output("out", out, call.out_shape, call)
        lse_shape = (call.B, call.Hq, call.Sq)
        if lse is None:
            lse = cupy.empty(lse_shape, dtype=cupy.float32)
        else:
            _check_like("lse", lse, lse_shape, "float32", call.device_id, c_contiguous=True)
        if out.size == 0:
            return (out, lse), None
        if call.Sk == 0:  # no keys at all: every row sees none
            _zero_fill(out)
            lse.fill(-np.inf)
            return (out, lse), None
        spec = _device_for(call, smem_limit)
        plan = plan_forward(call.problem(out), spec, resolve_policy(policy))
        os_ = call.bshd(out)
        qs, ks, vs = _operands_for(plan, (call.qs, call.ks, call.vs))
        forward = ForwardLaunch.of(plan, spec, call, qs, ks, vs, os_)
        staging = getattr(plan.config, "staging", None)  # K and V split into TF32 tiles once, for every query block
        # The staged array stays referenced until its kernel is launched: freed earlier,
        # its memory could be unmapped (no pool) or handed out again before the launch.
        staged = stage_tiles(staging, spec, ks, vs) if staging is not None else None
        pointers = (qs.data.ptr, ks.data.ptr, vs.data.ptr, os_.data.ptr, lse.data.ptr)
        forward(*pointers, cupy.cuda.get_current_stream().ptr, staged=0 if staged is None else staged.data.ptr)
    return (out, lse), (forward if staged is None and qs is call.qs else None)


def attention_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    *,
    causal=False,
    scale=None,
    layout="bshd",
    deterministic=True,
    dq=None,
    dk=None,
    dv=None,
    smem_limit=None,
    precision=None,
    policy=None,
):
    """Gradients (dq, dk, dv) of ``attention`` given dout = dLoss/dout.

    Args:
        dout, out: (B, Sq, Hq, Dv) in ``layout``, q's dtype and device; out and
           lse as returned by ``attention(..., return_lse=True)`` with the same
           q, k, v, causal and scale.
        lse: (B, Hq, Sq) float32, C-contiguous.
        q, k, v, causal, scale, layout, smem_limit, precision, policy: as for ``attention``
           (the backward's precision need not be the forward's).
        dq, dk, dv: optional output arrays shaped like q, k, v (q's dtype, last
           dimension contiguous); left untouched if validation fails. With GQA,
           dk and dv are summed over the query heads of each group.
        deterministic: results are bitwise identical run to run (the default):
           the GQA sum over query heads happens inside one block, and dQ comes from
           its own pass (S and dP recomputed) or, for float16 / bfloat16 on sm_90 at
           head dims up to 128, from the dK/dV pass, each key block adding its part
           to a float32 accumulator in its turn (``plan.BwdFusedWgmmaHalfConfig``,
           ordered), so no result depends on the order in which blocks finish.
           ``False`` lets the planner fuse dQ into the dK/dV pass with the adds in
           whatever order blocks finish (``plan.BwdFusedWgmmaConfig``: float32 in
           "fp32" / "tf32" on sm_90 into dq, where it measured faster;
           ``plan.BwdFusedWgmmaHalfConfig``: float16 / bfloat16 on sm_90); elsewhere
           it gives the deterministic algorithm. The float16 / bfloat16 fused pass
           takes a float32 accumulator of 4 * B * Hq * ceil(Sq / 64) * 64 * D_pad
           bytes (D_pad: the head dim up to a multiple of 64), then rounded into dq.

    Algorithm (FlashAttention-2): delta = rowsum(dout * out) (its own launch, or
    the staging launch of a wgmma dK/dV pass as it reads dout); a dK/dV pass that
    keeps a key tile and loops over query heads and tiles; a dQ pass that keeps
    a query tile and loops over key tiles. Each pass is planned on its own for
    the device's shared memory. The dQ pass runs on a second stream of the
    library's (one per device), beside the dK/dV pass, so that neither pass's
    last blocks leave SMs idle; it is forked from and joined back to the
    current stream with events, so work queued on the current stream after the
    call sees every gradient (calls from several host threads at once share
    that stream, which may order them after one another). Extra device memory
    beyond dq, dk, dv: delta, 4 * B * Hq * Sq bytes, the fused pass's float32 dQ
    accumulator (above), and the tiles the wgmma passes stage (``explain`` gives
    their bytes; both passes' at once); nothing of size Sq x Sk.

    A call whose arrays match an earlier call's in shape, strides, dtype, 16-byte alignment
    and device, with the same options, repeats that call's launches at the new addresses
    without validating or planning again (as ``attention`` does).
    """
    import cupy

    named = (
        ("dout", dout),
        ("q", q),
        ("k", k),
        ("v", v),
        ("out", out),
        ("lse", lse),
        ("dq", dq),
        ("dk", dk),
        ("dv", dv),
    )
    resolve_policy(policy)  # (a policy that is not one is refused first)
    arrays = tuple(_as_cupy(n, x) for n, x in named)
    options = dict(
        causal=causal,
        scale=scale,
        layout=layout,
        deterministic=deterministic,
        smem_limit=smem_limit,
        precision=precision,
        policy=policy,
    )
    key = None
    if all(isinstance(x, cupy.ndarray) for x in arrays[:6]) and all(
        x is None or isinstance(x, cupy.ndarray) for x in arrays[6:]
    ):
        key = backward_key(*(None if x is None else _describe(x) for x in arrays), **options)
        known = known_backward(key)
        if known is not None:  # seen before: valid, planned, compiled
            return known(*arrays)
    grads, backward = backward_uncached(*arrays, **options)
    if key is not None and backward is not None:
        remember_backward(key, backward)
    return grads


def backward_uncached(
    dout, q, k, v, out, lse, dq, dk, dv, *, causal, scale, layout, deterministic, smem_limit, precision, policy
):
    """``attention_backward``'s work from validation to launch, for CuPy arrays: ((dq, dk,
    dv), the ``BackwardLaunch`` a later call with arrays described alike may repeat, or None
    where the launches read more than the given arrays (tiles staged for them, operands
    rounded for them, dq zeroed for them) or none happened)."""
    import cupy

    policy = resolve_policy(policy)
    call = _validate(q, k, v, causal, scale, layout, precision)
    _check_like("dout", dout, call.out_shape, call.dtype, call.device_id)
    _check_like("out", out, call.out_shape, call.dtype, call.device_id)
    _check_like("lse", lse, (call.B, call.Hq, call.Sq), "float32", call.device_id, c_contiguous=True)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")
    with cupy.cuda.Device(call.device_id):  # (new gradients on q's device, as a repeated call makes them)
        dq = _output("dq", dq, call.shape_like("q"), call)
        dk = _output("dk", dk, call.shape_like("k"), call)
        dv = _output("dv", dv, call.shape_like("v"), call)
        if call.Sq == 0 or call.Sk == 0 or call.B == 0 or call.Hq == 0:
            for g in (dq, dk, dv):  # no query sees any key: every gradient is zero
                if g.size:
                    _zero_fill(g)
            return (dq, dk, dv), None
        spec = _device_for(call, smem_limit)
        bplan = plan_backward(call.problem(dout, deterministic=deterministic), spec, policy)
        dos, os_ = call.bshd(dout), call.bshd(out)
        dqs, dks, dvs = call.bshd(dq), call.bshd(dk), call.bshd(dv)
        operands = {}  # the inputs as each pass reads them (_operands_for), rounded once at most
        for plan in bplan.plans:  # on the caller's stream, before the dQ pass's stream forks off
            key = isinstance(plan.config, MmaConfig)
            if key not in operands:
                operands[key] = _operands_for(plan, (call.qs, call.ks, call.vs, dos))
        arrays = {"dout": dos, "out": os_, "lse": lse, "dq": dqs, "dk": dks, "dv": dvs}
        for plan in bplan.plans:
            arrays.update(zip(_operand_names(plan), operands[isinstance(plan.config, MmaConfig)]))
        backward = BackwardLaunch.of(bplan, spec, call, arrays)
        if backward.zero_dq:  # the float32 fused pass adds dQ into dq itself
            _zero_fill(dqs)

        def staged(step, plan, delta):
            """``plan``'s streamed tiles split into TF32 parts once, for every block (the float32
            wgmma passes; the query tiles' staging also writes delta), by address name."""
            staging = plan.config.staging
            qs, ks, vs, do_ = (arrays[n] for n in _operand_names(plan))
            tiles = (
                stage_tiles(staging, spec, qs, do_, os_, lse, delta)
                if staging.queries
                else stage_tiles(staging, spec, ks, vs)
            )
            return {f"staged:{step}": tiles}

        prepare = {
            step: functools.partial(staged, step, plan)
            for step, plan in (("dkdv", bplan.dkdv), ("dq", bplan.dq))
            if plan is not None and getattr(plan.config, "staging", None) is not None
        }
        backward.run({name: x.data.ptr for name, x in arrays.items()}, prepare)
        as_given = (call.qs, call.ks, call.vs, dos)
        reusable = (
            not prepare
            and not backward.zero_dq
            and all(
                all(a is b for a, b in zip(operands[isinstance(p.config, MmaConfig)], as_given)) for p in bplan.plans
            )
        )
    return (dq, dk, dv), (backward if reusable else None)
