"""Kernel launches through the CUDA driver's ``cuLaunchKernel`` (ctypes, libcuda.so.1), with
the arguments packed into one buffer: CuPy's launch converts each argument on every call,
which costs more host time than a small attention kernel runs.

A packed argument list puts each argument, as its bytes, in a slot of its own starting on
an 8-byte boundary (the driver copies each parameter by its size from where ``kernelParams``
points, so the host-side slots need no other alignment)."""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

_CUDA_ERROR_INVALID_CONTEXT = 201


@functools.cache
def _cu_launch_kernel():
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    fn.restype = ctypes.c_int
    return fn


def pack(args) -> tuple[bytes, tuple[int, ...]]:
    """``args`` (NumPy scalars and one-element structured arrays, as CuPy takes them) as one
    buffer and each argument's offset in it."""
    pieces, offsets, offset = [], [], 0
    for arg in args:
        if not isinstance(arg, (np.generic, np.ndarray)):
            raise TypeError(f"kernel arguments are NumPy scalars or arrays, got {type(arg).__name__}")
        data = arg.tobytes()
        offsets.append(offset)
        pieces.append(data + bytes(-len(data) % 8))
        offset += len(pieces[-1])
    return b"".join(pieces), tuple(offsets)


class Launcher:
    """Launches of the kernel ``function`` (a CUfunction) on ``blocks`` blocks of ``threads``
    threads with ``smem`` bytes of dynamic shared memory, arguments packed at ``offsets`` in
    ``size`` bytes. Its argument buffer is reused call after call (the driver has copied the
    arguments when cuLaunchKernel returns); a lock keeps two threads from filling it at once."""

    def __init__(self, function: int, blocks: int, threads: int, smem: int, offsets, size: int):
        self.function, self.blocks, self.threads, self.smem, self.size = function, blocks, threads, smem, size
        self._buffer = ctypes.create_string_buffer(max(size, 1))
        base = ctypes.addressof(self._buffer)
        self._params = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self._lock = threading.Lock()

    def __call__(self, stream: int, data: bytes) -> None:
        """Launch on ``stream`` (a CUstream, 0 for the legacy default stream) with ``data``, the
        packed arguments. Errors are CuPy's ``CUDADriverError``, as from a launch through CuPy."""
        if len(data) != self.size:
            raise ValueError(f"packed arguments: expected {self.size} bytes, got {len(data)}")
        with self._lock:
            ctypes.memmove(self._buffer, data, len(data))
            status = self._launch(stream)
            if status == _CUDA_ERROR_INVALID_CONTEXT:  # a thread whose device context is not bound yet
                import cupy

                cupy.cuda.runtime.free(0)  # binds the current device's primary context, as the runtime API does
                status = self._launch(stream)
        if status != 0:
            from cupy.cuda.driver import CUDADriverError

            raise CUDADriverError(status)

    def _launch(self, stream: int) -> int:
        fn = _cu_launch_kernel()
        return fn(self.function, self.blocks, 1, 1, self.threads, 1, 1, self.smem, stream, self._params, None)
