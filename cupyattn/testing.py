"""Helpers shared by the tests and ``python -m cupyattn check``: random device
inputs in every dtype (bfloat16 through its bit pattern, so only the dtype object
comes from ml_dtypes), host copies as float32, and FlashAttention's error rule."""

from __future__ import annotations

import dataclasses

import numpy as np

from .reference import round_to, tolerance


def gpu_unavailable_reason() -> str | None:
    """None if CuPy sees a CUDA device, else why not (no driver, no CuPy, no device)."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return None if n > 0 else "no CUDA device found"


def bfloat16_dtype():
    """NumPy's bfloat16 dtype (from ml_dtypes), or None when ml_dtypes is absent."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def host_values(shape, dtype: str, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """Fresh standard-normal values, already rounded to ``dtype``, as float32."""
    return round_to(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale), dtype)


def device_values(shape, dtype: str, rng):
    """Fresh standard-normal values made on the device by a ``cupy.random`` generator,
    in ``dtype`` (bfloat16 by truncating the float32 bits): for sizes where host
    generation and copying would dominate, when no host copy is needed."""
    import cupy

    x = rng.standard_normal(shape, dtype=cupy.float32)
    if dtype == "bfloat16":
        return (x.view(cupy.uint32) >> 16).astype(cupy.uint16).view(bfloat16_dtype())
    return x if dtype == "float32" else x.astype(dtype)


def to_device(x: np.ndarray, dtype: str):
    """A CuPy array of ``dtype`` holding the float32 values ``x`` (exact if pre-rounded)."""
    import cupy

    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        bf16 = bfloat16_dtype()
        if bf16 is None:
            raise RuntimeError("bfloat16 arrays need the ml_dtypes package")
        bits = (round_to(x, "bfloat16").view(np.uint32) >> 16).astype(np.uint16)
        return cupy.asarray(bits).view(bf16)
    return cupy.asarray(x.astype(dtype))


def to_host(x) -> np.ndarray:
    """A device array of any supported dtype as host float32 (any strides)."""
    import cupy

    if np.dtype(x.dtype).name == "bfloat16":
        bits = cupy.ascontiguousarray(x).view(cupy.uint16).get().astype(np.uint32) << 16
        return bits.view(np.float32)
    return cupy.asnumpy(x).astype(np.float32)


def poison(x) -> None:
    """Fill a device array with NaN (every supported dtype), to catch unwritten outputs."""
    import cupy

    nan_bits = {2: 0x7E00 if np.dtype(x.dtype).name == "float16" else 0x7FC0, 4: 0x7FC00000}
    x.view(cupy.dtype(f"u{x.itemsize}")).fill(nan_bits[x.itemsize])


@dataclasses.dataclass(frozen=True)
class Comparison:
    error: float  # max |out - ref64|
    reference_error: float  # max |ref_same_precision - ref64|
    tol: float

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.error) and self.error <= self.tol)

    def __str__(self):
        return f"max err {self.error:.3g} (same-precision reference {self.reference_error:.3g}, tol {self.tol:.3g})"


def compare(
    out: np.ndarray,
    ref64: np.ndarray,
    ref_same: np.ndarray,
    dtype: str,
    seqlen_k: int = 1,
    factor: float = 2.0,
    logit_bound: float = 0.0,
    extra: float = 0.0,
) -> Comparison:
    """FlashAttention's rule: |out - ref64| <= factor * |ref_same - ref64| + floor (max norms);
    the floor is ``reference.tolerance``'s, plus ``extra`` (an error the kernel may make
    that the same-precision reference need not, e.g. ``reference.delta_cancellation_error``)."""
    out = np.asarray(out, dtype=np.float64)
    if out.size == 0:
        return Comparison(0.0, 0.0, 0.0)
    err = float(np.max(np.abs(out - ref64))) if np.all(np.isfinite(out)) else float("nan")
    ref_err = float(np.max(np.abs(np.asarray(ref_same, np.float64) - ref64)))
    magnitude = float(np.max(np.abs(ref64)))
    return Comparison(err, ref_err, tolerance(ref_err, dtype, magnitude, seqlen_k, factor, logit_bound) + extra)


def median_ms(fn, repeats: int = 10, warmup: int = 1) -> float:
    """Median time of ``fn()`` in milliseconds, by CUDA events on the current stream."""
    import cupy

    for _ in range(warmup):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def peak_allocation_hook():
    """A CuPy memory hook that records, while active (``with hook:``), the peak bytes
    allocated through CuPy's memory pool above what was live when it started:
    ``hook.peak``. What a call allocates for its outputs and workspace."""
    import cupy

    class PeakHook(cupy.cuda.MemoryHook):
        name = "PeakHook"

        def __init__(self):
            self.live = self.peak = 0
            self.sizes = {}

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            self.sizes[mem_ptr] = mem_size
            self.live += mem_size
            self.peak = max(self.peak, self.live)

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            self.live -= self.sizes.pop(mem_ptr, 0)

    return PeakHook()
