"""Shared-memory layouts as ordered, named buffers: the single source of truth.

The launch's dynamic shared memory is ``Layout.total``; each kernel derives the
same offsets from its template parameters, and ``check_expression`` names a
compile-time check (``cupyattn::check_layout``) that fails to compile if the two
ever disagree. It is compiled next to every kernel.
"""

from __future__ import annotations

import dataclasses
import math

ALIGN = 16  # every buffer starts on a 16-byte boundary (vector loads, cp.async)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint64": 8}  # uint64: mbarriers


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


_align = align  # (LayoutBuilder.add's parameter of the same name shadows it)


@dataclasses.dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]  # elements
    dtype: str  # float32 / float16 / bfloat16; uint64 for mbarriers
    offset: int  # bytes from the start of dynamic shared memory
    note: str = ""

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]

    @property
    def end(self) -> int:
        return self.offset + self.bytes


@dataclasses.dataclass(frozen=True)
class Layout:
    buffers: tuple[Buffer, ...]

    @property
    def total(self) -> int:
        return self.buffers[-1].end if self.buffers else 0

    def __iter__(self):
        return iter(self.buffers)

    def __getitem__(self, name: str) -> Buffer:
        for buf in self.buffers:
            if buf.name == name:
                return buf
        raise KeyError(name)

    def table(self, with_total: bool = True) -> str:
        """One line per buffer: name, element shape, dtype, bytes, offset, note; then the total."""
        rows = [f"  {'buffer':<10} {'shape':<14} {'dtype':<9} {'bytes':>8} {'offset':>8}"]
        for b in self.buffers:
            shape = "x".join(str(s) for s in b.shape)
            note = f"  ({b.note})" if b.note else ""
            rows.append(f"  {b.name:<10} {shape:<14} {b.dtype:<9} {b.bytes:>8} {b.offset:>8}{note}")
        if with_total:
            rows.append(f"  {'total':<10} {'':<14} {'':<9} {self.total:>8}")
        return "\n".join(rows)


class LayoutBuilder:
    """Appends buffers in order, each aligned to 16 bytes (or ``align``), as the kernels do."""

    def __init__(self):
        self._buffers: list[Buffer] = []
        self._end = 0

    def add(self, name: str, shape: tuple[int, ...], dtype: str, note: str = "", align: int = ALIGN) -> LayoutBuilder:
        buf = Buffer(name, tuple(int(s) for s in shape), dtype, _align(self._end, align), note)
        self._buffers.append(buf)
        self._end = buf.end
        return self

    @property
    def end(self) -> int:
        """Bytes taken by the buffers added so far."""
        return self._end

    def build(self) -> Layout:
        return Layout(tuple(self._buffers))
