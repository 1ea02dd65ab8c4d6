"""A compiled kernel's PTX run on the CPU, block after block, so that device code that
computes addresses, moves words, does float32 arithmetic and meets other threads
(wgmma_tiles.cuh's rearrangements, the staging launches, the wgmma kernels' producer /
consumer protocol, the mma.sync kernels' cp.async pipelines) is checked as the compiler
built it, where no GPU is at hand.

A block's threads run one after another, each up to its next meeting point: a barrier
(bar.sync / barrier.sync, the block's or a named one of some threads; bar.arrive counts
towards one without waiting), its warp's shuffle, elect.sync, __syncwarp, ldmatrix or
mma.sync, its warpgroup's wgmma, or an mbarrier wait whose phase has not completed (it
tries again once the others have moved). A round in which no thread moves is a deadlock
(DeadlockError, saying where each thread waits); a thread that runs trap raises
TrapError. Memory ordering is tracked with vector clocks: barriers, mbarrier phases
(arrivals, and bulk copies' bytes, release; a completed wait acquires), shuffles and
__syncwarp order what they join. A 4-byte word of shared memory that two threads touch
unordered, one storing, is a race (RaceError; global memory is not checked); a wgmma
reads its operands from its issue until the wait_group that retires it, and a store to
them in between is a race too (a bulk tensor store's source alike, until its
wait_group.read). Words a thread stored with ordinary stores must pass its
fence.proxy.async before a wgmma reads them or a bulk copy overwrites them (RaceError,
naming the fence).

Emulated: integer and predicate arithmetic, branches, loads and stores (8 to 64 bits,
vectors; a struct parameter's bytes through its generic address too), packing moves
(mov.b32 {lo, hi}), stmatrix .x4, cp.async (its source read at issue, its bytes a store from its issue
to the wait_group or wait_all that completes its group: checked against earlier accesses
at issue, stored at the wait; a shared word touched while a copy to it is in flight is a
race, as is a thread that ends with one), cp.async.bulk (done at once,
its bytes counted on its mbarrier), cp.async.bulk.tensor loads and stores of boxes of a
tensor_map (this module's own encoding: the driver's maps are opaque), with zeros for
a load's elements outside the tensor, a store clipped to it, and the 128-byte swizzle
on the absolute shared addresses; mbarriers (arrivals and transaction bytes:
expect_tx), elect.sync, vote.sync.any, float32 add, sub, mul, fma and reciprocal rounded to nearest
even as the GPU rounds them (no flush to zero), max, min, comparisons, int to float,
TF32 rounding (cvt.rna.tf32.f32; NaNs kept), float16 and bfloat16 conversions to and from float32
(nearest even; exact), float32 atomic adds to global memory (in the order the threads
run) and bulk reductions into it (cp.reduce.async.bulk .add.f32, done at once), integer
adds to global counters (red.global.add: blocks run in turn, so an acquire load sees
those of the blocks before); ldmatrix m8n8 .x1, .x2, .x4 (.trans) of b16 (each row a
shared load of the lane that addresses it); mma.sync m16n8k16 float16 / bfloat16 and
m16n8k8 TF32 with float32 accumulators (the PTX ISA's register fragments) and
wgmma.mma_async m64nNk8 TF32 and m64nNk16 float16 / bfloat16 (operands from shared
memory through their descriptors - no swizzle, K-major, as wgmma.cuh's core matrices,
or the 128-byte swizzle, K-major or MN-major, the swizzle on absolute addresses as the
hardware does - or A from registers), both with TF32 operands' top 19 bits and
products exact in float64, summed there and added to float32 accumulators (near the
tensor cores' results, not their bits); ex2.approx (2^x rounded to nearest: near,
not the GPU's bits) - so a kernel's results are checked against a reference with a
tolerance, its data movement exactly. A shared word read before anything stored it is
an UninitializedError. Anything else (division, other float operations and atomics,
float16 arithmetic, other mma shapes and types, 32- and 64-byte swizzles, descriptor
base offsets, clusters, ...) raises NotImplementedError naming the instruction, so a
kernel never runs partly emulated. Global memory is the kernel's array arguments (and
tensor maps' arrays), each at its own address; shared memory starts as 0xFF bytes
(NaN), not zeros.
"""

import re
import struct

import numpy as np

_GLOBAL_BASE = 1 << 40  # argument i's array at (i + 1) << 40: no two overlap
_SHARED_WINDOW = 1 << 56  # generic addresses of shared memory (cvta)
_PARAM_WINDOW = 1 << 60  # a struct parameter's bytes at _PARAM_WINDOW + (its index << 32)
# Where a thread stops: a barrier, its warp's shuffle or __syncwarp, its warpgroup's
# wgmma, an mbarrier phase not yet complete, its end.
_BARRIER, _SHUFFLE, _WARP_SYNC, _WGMMA, _YIELD, _EXIT = "barrier", "shuffle", "warp sync", "wgmma", "yield", "exit"


class RaceError(AssertionError):
    pass


class DeadlockError(AssertionError):
    pass


class TrapError(AssertionError):
    """A thread ran trap (__trap())."""


class UninitializedError(AssertionError):
    """Shared memory read before anything stored it (it holds 0xFF bytes: NaN)."""


def _split_operands(text: str) -> list[str]:
    """Top-level comma-separated operands ({...} and [...] kept whole)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    return out + [tail] if tail else out


def _types(opcode: str) -> list[tuple[str, int]]:
    """The opcode's type suffixes, in order: ("s" | "u" | "b" | "f", bits)."""
    return [(k, int(b)) for k, b in re.findall(r"\.([subf])(8|16|32|64)\b", opcode)]


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _immediate(token: str):
    if re.fullmatch(r"-?\d+", token):
        return int(token)
    if re.fullmatch(r"-?0[xX][0-9a-fA-F]+", token):
        return int(token, 16)
    if re.fullmatch(r"0[fF][0-9a-fA-F]{8}|0[dD][0-9a-fA-F]{16}", token):  # float bits
        return int(token[2:], 16)
    return None


_F32, _U32 = struct.Struct("<f"), struct.Struct("<I")


def _float(bits: int) -> float:
    return _F32.unpack(_U32.pack(bits & 0xFFFFFFFF))[0]


def _bits(x) -> int:
    """x (a float) rounded to float32, nearest even (C's cast), as its bits."""
    try:
        return _U32.unpack(_F32.pack(x))[0]
    except OverflowError:  # (past float32's range: infinity, as the cast gives)
        with np.errstate(over="ignore"):
            return int(np.float32(x).view(np.uint32))


def _fma(a: float, b: float, c: float) -> int:
    """fma.rn.f32: a * b + c rounded once. In doubles a * b is exact, and s = a * b + c
    is off the exact sum by e (TwoSum, exact); s rounds to the float32 the exact sum
    does unless s is halfway between two float32, where e's sign says which."""
    product = a * b
    s = product + c
    if not np.isfinite(s) or not all(np.isfinite((a, b, c))):
        return _bits(np.float32(s))
    back = s - product
    e = (product - (s - back)) + (c - back)
    f = np.float32(s)
    if e == 0 or float(f) == s:
        return _bits(f)
    other = np.nextafter(f, np.float32(np.inf if s > float(f) else -np.inf))
    if (float(f) + float(other)) / 2 != s:  # (not halfway: s and the exact sum round alike)
        return _bits(f)
    return _bits(other if (float(other) > s) == (e > 0) else f)


def _tf32_rna(bits: int) -> int:
    """cvt.rna.tf32.f32: the magnitude rounded half up at bit 13 (a carry may reach the
    exponent, as rounding up should), the low 13 bits cleared. Infinities and NaNs only
    lose their low 13 bits (the SASS ptxas emits for sm_80 and sm_90 skips the add for
    them); a NaN whose payload is only there would become an infinity, which the PTX ISA
    does not say (refused)."""
    bits &= 0xFFFFFFFF
    if bits & 0x7F800000 == 0x7F800000:
        if bits & 0x7FFFFF and not bits & 0x7FE000:
            raise NotImplementedError("cvt.rna.tf32.f32 of a NaN with a payload in its low 13 bits only")
        return bits & 0xFFFFE000
    return (bits + 0x1000) & 0xFFFFE000


def _reciprocal(x: float) -> int:
    """rcp.rn.f32: 1 / x rounded once. 1 / x in doubles rounds the same way unless it lands
    halfway between two float32, where the exact quotient (never itself halfway unless x is
    a power of two, whose reciprocal is exact) says which."""
    if x == 0 or not np.isfinite(x):
        with np.errstate(divide="ignore"):
            return _bits(np.float32(1) / np.float32(x))
    s = 1.0 / x
    f = np.float32(s)
    if float(f) == s or not np.isfinite(f):
        return _bits(f)
    other = np.nextafter(f, np.float32(np.inf if s > float(f) else -np.inf))
    if (float(f) + float(other)) / 2 != s:
        return _bits(f)
    from fractions import Fraction

    exact = 1 / Fraction(x)
    return _bits(other if (float(other) > s) == (exact > Fraction(s)) else f)


def _f16(bits: int) -> int:
    """cvt.rn.f16.f32: float32 bits to float16 bits, nearest even (NumPy's cast rounds so,
    subnormals and overflow to infinity included); a NaN gives the canonical 0x7FFF."""
    x = np.uint32(bits & 0xFFFFFFFF).view(np.float32)
    if np.isnan(x):
        return 0x7FFF
    with np.errstate(over="ignore"):
        return int(x.astype(np.float16).view(np.uint16))


def _bf16(bits: int) -> int:
    """cvt.rn.bf16.f32: the top 16 bits of float32 bits rounded to nearest even (a carry
    may reach the exponent, up to infinity); a NaN gives the canonical 0x7FFF."""
    bits &= 0xFFFFFFFF
    if bits & 0x7FFFFFFF > 0x7F800000:
        return 0x7FFF
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def _half_to_f32(kind: str, bits: int) -> int:
    """cvt.f32.f16 / cvt.f32.bf16: exact."""
    if kind == "bf16":
        return (bits & 0xFFFF) << 16
    return _bits(float(np.uint16(bits & 0xFFFF).view(np.float16)))


def _max_min(pick):
    """max.f32 / min.f32: a NaN operand gives the other one."""

    def f(a, b, c):
        return _bits(np.float32(b if np.isnan(a) else a if np.isnan(b) else pick(a, b)))

    return f


# float32 operations on the operands' values (Python floats, exact): add, sub and mul
# rounded once in double, then to float32, are rounded as once to float32 (53 >= 2 x 24 + 2).
_FLOAT_OPS = {
    "add": lambda a, b, c: _bits(a + b),
    "sub": lambda a, b, c: _bits(a - b),
    "mul": lambda a, b, c: _bits(a * b),
    "fma": _fma,
    "neg": lambda a, b, c: _bits(-a),
    "abs": lambda a, b, c: _bits(abs(a)),
    "max": _max_min(max),
    "min": _max_min(min),
}


def _integer_op(name: str, op: str, bits: int, signed: bool):
    """f(a, b, c) of one integer instruction on operands already masked to ``bits``."""

    def s(x):
        return _signed(x, bits) if signed else x

    if name == "mul" and ".wide" in op:
        return lambda a, b, c: s(a) * s(b)
    if name == "mul" and ".hi" in op:  # (what division by a constant compiles to)
        return lambda a, b, c: (s(a) * s(b)) >> bits
    if name == "mul" and ".lo" in op:
        return lambda a, b, c: a * b
    if name == "mad" and ".lo" in op:
        return lambda a, b, c: a * b + c
    if name in ("div", "rem"):

        def divide(a, b, c):
            x, y = s(a), s(b)
            q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            return q if name == "div" else x - q * y

        return divide
    if name == "shr":
        return (lambda a, b, c: _signed(a, bits) >> min(b, bits - 1)) if signed else (lambda a, b, c: a >> min(b, bits))
    if name in ("min", "max"):
        pick = min if name == "min" else max
        return lambda a, b, c: pick(s(a), s(b))
    simple = {
        "add": lambda a, b, c: a + b,
        "sub": lambda a, b, c: a - b,
        "shl": lambda a, b, c: a << min(b, bits),
        "and": lambda a, b, c: a & b,
        "or": lambda a, b, c: a | b,
        "xor": lambda a, b, c: a ^ b,
        "not": lambda a, b, c: ~a,
        "neg": lambda a, b, c: -a,
    }
    if name in simple:
        return simple[name]
    raise NotImplementedError(op)


_TENSOR_MAP_MAGIC = int.from_bytes(b"emu.tmap", "little")
_TENSOR_ARRAYS: list = []  # the arrays tensor_map described (a map names its array's index here)


def tensor_map(array: np.ndarray, box_rows: int, box_cols: int = 64, swizzle: int = 128) -> np.ndarray:
    """A tensor map for the emulator's cp.async.bulk.tensor (the driver's maps are opaque,
    so this encoding is the emulator's own) over a (B, S, H, D) ``array`` (or (rows,
    columns)) of 2-byte elements (float16, or bfloat16 as uint16) or 4-byte ones: dims
    {D, S, H, B} innermost first, their strides the array's (D contiguous, the others
    multiples of 16 bytes), box {box_cols, box_rows, 1, 1}, coordinates {column, row,
    head, batch}. ``swizzle`` 128 (box rows of exactly 128 bytes, written with the
    128-byte swizzle) or 0 (box rows a multiple of 16 bytes, written in order).

    uint64[16]: [0] b"emu.tmap", [1] the array's index in _TENSOR_ARRAYS (which keeps it
    alive), [2] rank | element bytes << 8 | swizzle << 16, [3:3+rank] dims, [7:7+rank]
    byte strides, [11:11+rank] box, each innermost first."""
    size = array.itemsize
    if array.ndim not in (2, 4) or size not in (2, 4):
        raise ValueError(f"tensor_map: (B, S, H, D) or (rows, columns) of 2- or 4-byte elements, not {array.shape}")
    axes = (3, 1, 2, 0) if array.ndim == 4 else (1, 0)
    rank, dims, strides = len(axes), [array.shape[a] for a in axes], [array.strides[a] for a in axes]
    if strides[0] != size or any(x % 16 or x <= 0 or x >= 1 << 40 for x in strides[1:]):
        raise ValueError(f"tensor_map: strides {array.strides} (D contiguous, the rest multiples of 16 bytes)")
    box = (box_cols, box_rows) + (1,) * (rank - 2)
    if not all(1 <= b <= 256 for b in box):
        raise ValueError(f"tensor_map: box {box} (1 to 256 each)")
    if swizzle == 128 and box_cols * size != 128 or swizzle == 0 and box_cols * size % 16 or swizzle not in (0, 128):
        raise ValueError(f"tensor_map: swizzle {swizzle} with {box_cols * size}-byte box rows")
    index = next((i for i, x in enumerate(_TENSOR_ARRAYS) if x is array), None)  # (one entry an array)
    if index is None:
        index = len(_TENSOR_ARRAYS)
        _TENSOR_ARRAYS.append(array)
    words = np.zeros(16, np.uint64)
    words[0], words[1], words[2] = _TENSOR_MAP_MAGIC, index, rank | size << 8 | swizzle << 16
    words[3 : 3 + rank], words[7 : 7 + rank], words[11 : 11 + rank] = dims, strides, box
    return words


class PtxKernel:
    """The body of one .entry of ``ptx``, parsed once; ``run`` executes a grid of it."""

    def __init__(self, ptx: str, entry: str | None = None):
        entries = re.findall(r"\.entry\s+(\w+)\s*\(", ptx)
        if entry is None:
            if len(entries) != 1:
                raise ValueError(f"name the entry: {entries}")
            entry = entries[0]
        m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)[^{]*\{", ptx, re.S)  # (.maxntid, ...)
        if not m:
            raise ValueError(f"no entry {entry} in the PTX")
        declared = re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.\w+\s+(\w+)(?:\[(\d+)\])?", m.group(1))
        self.params = [name for name, _ in declared]
        self.struct_params = {name: int(size) for name, size in declared if size}  # (passed by value: bytes)
        body, depth, i = [], 1, m.end()
        while depth:  # the entry's braces (inline asm adds scopes of its own)
            ch = ptx[i]
            depth += ch == "{"
            depth -= ch == "}"
            body.append(ch)
            i += 1
        # Shared arrays: the static ones one after another, the dynamic one (extern) after them.
        self.shared_symbols, self.static_shared, dynamic = {}, 0, []
        for extern, align, bits, name, size in re.findall(
            r"(\.extern\s+)?\.shared\s+\.align\s+(\d+)\s+\.[a-z]+(\d+)\s+(\w+)(?:\[(\d*)\])?\s*;", ptx
        ):
            if extern:
                dynamic.append((int(align), name))
                continue
            self.static_shared = -(-self.static_shared // int(align)) * int(align)
            self.shared_symbols[name] = self.static_shared
            self.static_shared += int(size) if size else int(bits) // 8  # (an array's bytes, or one value)
        for align, name in dynamic:
            self.static_shared = -(-self.static_shared // align) * align
            self.shared_symbols[name] = self.static_shared
        self.statements, self.labels = [], {}
        text = re.sub(r"//[^\n]*", "", "".join(body[:-1]))
        for statement in re.split(r";|\n", text):
            statement = statement.strip().strip("{}").strip()
            while True:
                label = re.match(r"(\$?[\w$]+):\s*", statement)
                if not label:
                    break
                self.labels[label.group(1)] = len(self.statements)
                statement = statement[label.end() :]
            if statement and not statement.startswith("."):  # (declarations: .reg, ...)
                self.statements.append(statement)

    def run(
        self, threads: int, args: list, shared_bytes: int = 0, blocks: int = 1, wavefronts: dict | None = None
    ) -> list:
        """Run ``blocks`` blocks (x only) of ``threads`` threads with ``args``, one block
        after another: for a pointer, a contiguous numpy array or (array, byte offset)
        (read and written in place; the same array twice is one allocation); for a struct
        passed by value, a function of ``pointer(array) -> address`` that returns it as a
        one-element structured array (kernel_args.attn_args), or those bytes as an array
        (a struct of tensor_map's maps, which need no pointer); else an int.
        ``shared_bytes``: the dynamic shared memory. ``wavefronts``: filled with, for each
        shared-memory load or store statement (ldmatrix too), the shared-memory wavefronts
        of each time a warp ran it (bank_wavefronts). Returns ``args``."""
        grid = _Grid(self, threads, args, shared_bytes, blocks)
        grid.log_shared = wavefronts is not None
        for block in range(blocks):
            grid.run_block(block)
            if wavefronts is not None:
                for (_, pc), lanes in sorted(grid.shared_accesses.items()):
                    runs = wavefronts.setdefault(self.statements[pc], [])
                    for k in range(max(len(a) for a in lanes.values())):
                        runs.append(bank_wavefronts([a[k] for a in lanes.values() if k < len(a)]))
        return args


def bank_wavefronts(accesses: list) -> int:
    """Shared-memory wavefronts of one warp's access ((lane, byte address, bytes) a lane,
    all of one width): lanes go in phases of 128 bytes (32 lanes of 4-byte words, 16 of 8,
    8 of 16), and a phase takes as many wavefronts as the most distinct words any of the
    32 banks holds (the same word is broadcast)."""
    width = accesses[0][2]
    per_phase = 128 // width
    total = 0
    for phase in {lane // per_phase for lane, _, _ in accesses}:
        words = {
            word
            for lane, at, size in accesses
            if lane // per_phase == phase
            for word in range(at // 4, (at + size) // 4)
        }
        banks: dict = {}
        for word in words:
            banks[word % 32] = banks.get(word % 32, 0) + 1
        total += max(banks.values())
    return total


class _Grid:
    """The kernel's memory and threads; each statement decoded once into a step(thread's
    registers) that returns the next statement's index, or where the thread stops."""

    def __init__(self, kernel: PtxKernel, threads: int, args: list, shared_bytes: int, blocks: int):
        if len(args) != len(kernel.params):
            raise ValueError(f"{len(kernel.params)} parameters, {len(args)} arguments")
        if threads % 32:
            raise NotImplementedError("whole warps only")
        self.k, self.threads, self.blocks = kernel, threads, blocks
        self.shared_bytes = kernel.static_shared + shared_bytes
        self.arrays = {}  # id(array) -> (base, byte view)
        self.param_values = {}
        self.param_structs = {}  # name -> (its address in param space, the bytes of a struct passed by value)
        for i, (name, arg) in enumerate(zip(kernel.params, args)):
            if callable(arg) or name in kernel.struct_params and isinstance(arg, np.ndarray):
                blob = (arg(self._address_of) if callable(arg) else arg).tobytes()
                if name in kernel.struct_params and len(blob) < kernel.struct_params[name]:
                    raise ValueError(
                        f"argument {i}: {len(blob)} bytes, the kernel's struct has {kernel.struct_params[name]}"
                    )
                self.param_structs[name] = (_PARAM_WINDOW + (i << 32), blob)
                continue
            array, offset = arg if isinstance(arg, tuple) else (arg, 0)
            if isinstance(array, np.ndarray):
                if not array.flags.c_contiguous:
                    raise ValueError(f"argument {i}: a contiguous array (or one and a byte offset)")
                self.param_values[name] = self._address_of(array) + offset
            elif isinstance(arg, (float, np.floating)):
                self.param_values[name] = _bits(arg)  # (a float parameter: its float32 bits)
            else:
                self.param_values[name] = int(arg)
        self.dynamic_shared = shared_bytes
        self.log_shared = False  # (run: wavefronts)
        self.steps = [self._decode(pc, s) for pc, s in enumerate(kernel.statements)]

    def _address_of(self, array) -> int:
        """Where ``array`` lives in global memory (read and written in place): a contiguous
        array, or a view into one (at its byte offset there)."""
        owner = array
        while not owner.flags.c_contiguous and isinstance(owner.base, np.ndarray):
            owner = owner.base
        if not owner.flags.c_contiguous:
            raise ValueError("an array argument: contiguous, or a view into a contiguous array")
        if id(owner) not in self.arrays:
            self.arrays[id(owner)] = ((len(self.arrays) + 1) * _GLOBAL_BASE, owner.reshape(-1).view(np.uint8))
        offset = array.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
        return self.arrays[id(owner)][0] + offset

    # memory ------------------------------------------------------------------
    def _where(self, space: str, address: int, size: int):
        if space in ("", "param") and address >= _PARAM_WINDOW:  # (a struct parameter's bytes: read only)
            for at, blob in self.param_structs.values():
                if at <= address and address + size <= at + len(blob):
                    return np.frombuffer(blob, np.uint8), address - at, False
            raise IndexError(f"parameter access at {address:#x} ({size} bytes) outside every struct parameter")
        if space == "" and address >= _SHARED_WINDOW:
            space, address = "shared", address - _SHARED_WINDOW
        if space == "shared":
            if address < 0 or address + size > self.shared.size:
                raise IndexError(f"shared access at {address} ({size} bytes) outside {self.shared.size}")
            return self.shared, address, True
        for base, view in self.arrays.values():
            if base <= address and address + size <= base + view.size:
                return view, address - base, False
        raise IndexError(f"global access at {address:#x} ({size} bytes) outside every argument")

    def _touch(self, thread: int, address: int, size: int, stored: bool, proxy: str = "generic", record=True):
        """Thread ``thread`` reads or stores shared bytes [address, address + size): a race
        unless every earlier store (and, storing, every earlier read) of each word happened
        before, by the vector clocks; ``proxy`` "async": a bulk copy's store, which must
        not overwrite a word stored by ordinary stores before their fence.proxy.async.
        ``record`` false: only the checks (a cp.async's issue, whose bytes may land then)."""
        clock = self.clocks[thread]
        for word in range(address // 4, (address + size + 3) // 4):
            if word in self.copying:  # (no wait has completed it: it may land at any time)
                raise RaceError(
                    f"shared word at byte {4 * word}: thread {thread} {'stores' if stored else 'loads'} it "
                    f"while thread {self.copying[word]}'s cp.async to it is in flight (before the "
                    "cp.async.wait_group that completes it)"
                )
            if not stored and word not in self.words:
                raise UninitializedError(f"shared word at byte {4 * word}: thread {thread} loads it, nothing stored it")
            writer, written, readers, unfenced = self.words.get(word, (None, 0, None, None))
            if writer is not None and writer != thread and written > clock[writer]:
                raise RaceError(
                    f"shared word at byte {4 * word}: thread {thread} {'stores' if stored else 'loads'} "
                    f"it, thread {writer} stored it, unordered (not before it: no barrier, mbarrier "
                    "phase or shuffle between them)"
                )
            pending = self.in_flight.get(word)
            if stored and pending:
                raise RaceError(
                    f"shared word at byte {4 * word}: thread {thread} stores it while a wgmma or bulk "
                    "store still reads it (before a wait_group retires it)"
                )
            if stored and readers:
                for reader, read in readers.items():
                    if isinstance(read, _AsyncRead):  # (async: after any wait_group that saw it done)
                        if not any(t == thread or c <= clock[t] for t, c in read.observed):
                            raise RaceError(
                                f"shared word at byte {4 * word}: thread {thread} stores it, {read.what} of "
                                f"threads {sorted({t for t, _ in read.observed})} read it, unordered "
                                "with every wait_group that retired it"
                            )
                    elif reader != thread and read > clock[reader]:
                        raise RaceError(
                            f"shared word at byte {4 * word}: thread {thread} stores it, thread {reader} "
                            "loaded it, unordered (not before it: no barrier, mbarrier phase or "
                            "shuffle between them)"
                        )
            if stored and proxy == "async" and unfenced is not None:
                raise RaceError(
                    f"shared word at byte {4 * word}: a bulk copy overwrites it, thread {unfenced} "
                    "stored it with no fence.proxy.async since"
                )
            if not record:
                continue
            if stored:
                if proxy == "generic":
                    self.unfenced[thread].add(word)
                self.words[word] = (thread, clock[thread], None, thread if proxy == "generic" else None)
            else:
                readers = dict(readers or ())
                readers[thread] = clock[thread]
                self.words[word] = (writer, written, readers, unfenced)

    def _async_reads(self, clock: np.ndarray, read: "_AsyncRead") -> None:
        """A wgmma or bulk store reads ``read.words`` from its issue (its threads' joined
        ``clock``): each stored before it (and fenced for the async proxy), read until a
        wait_group of one of its threads retires it."""
        for word in read.words:
            if word in self.copying:
                raise RaceError(
                    f"shared word at byte {4 * word}: {read.what} reads it while thread "
                    f"{self.copying[word]}'s cp.async to it is in flight"
                )
            if word not in self.words:
                raise UninitializedError(f"shared word at byte {4 * word}: {read.what} reads it, nothing stored it")
            writer, written, _, unfenced = self.words.get(word, (None, 0, None, None))
            if writer is not None and written > clock[writer]:
                raise RaceError(
                    f"shared word at byte {4 * word}: {read.what} reads it, thread {writer} stored it, unordered"
                )
            if unfenced is not None:
                raise RaceError(
                    f"shared word at byte {4 * word}: {read.what} reads it, thread {unfenced} stored it "
                    "with no fence.proxy.async since"
                )
            self.in_flight.setdefault(word, set()).add(id(read))

    def _retire_reads(self, thread: int, read: "_AsyncRead") -> None:
        """A wait_group of ``thread`` retires the wgmma: its reads are done, before whatever
        the thread does next (and before what any other of its threads does after its own
        wait_group)."""
        read.observed.append((thread, self.clocks[thread][thread]))
        if len(read.observed) > 1:
            return
        for word in read.words:
            pending = self.in_flight[word]
            pending.discard(id(read))
            if not pending:
                del self.in_flight[word]
            writer, written, readers, unfenced = self.words.get(word, (None, 0, None, None))
            readers = dict(readers or ())
            readers[id(read)] = read
            self.words[word] = (writer, written, readers, unfenced)

    def load(self, thread: int, space: str, address: int, size: int) -> int:
        mem, at, shared = self._where(space, address, size)
        if shared:
            self._touch(thread, at, size, False)
        return int.from_bytes(mem[at : at + size].tobytes(), "little")

    def store(self, thread: int, space: str, address: int, size: int, value: int):
        mem, at, shared = self._where(space, address, size)
        if shared:
            self._touch(thread, at, size, True)
        mem[at : at + size] = np.frombuffer((value & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), np.uint8)

    # decoding ----------------------------------------------------------------
    def _operand(self, token: str):
        """regs -> the operand's value (regs["%tid.x"] etc. hold the thread's specials)."""
        imm = _immediate(token)
        if imm is not None:
            return lambda regs: imm
        if token in self.k.shared_symbols:
            at = self.k.shared_symbols[token]
            return lambda regs: at
        if token in self.param_structs:
            at = self.param_structs[token][0]
            return lambda regs: at
        if token.startswith("%") or re.fullmatch(r"[A-Za-z_][\w$]*", token):  # (inline asm's own: p, ok)

            def register(regs):
                try:
                    return regs[token]
                except KeyError:
                    raise KeyError(f"register {token} read before it is written") from None

            return register
        raise NotImplementedError(f"operand {token}")

    def _address(self, token: str):
        m = re.fullmatch(r"\[\s*([^\]+]+?)\s*(?:\+\s*(-?\w+))?\s*\]", token)
        if not m:
            raise NotImplementedError(f"address {token}")
        offset = int(m.group(2), 0) if m.group(2) else 0
        if m.group(1) in self.param_values:
            at = self.param_values[m.group(1)] + offset
            return lambda regs: at
        base = self._operand(m.group(1))
        return lambda regs: base(regs) + offset

    def _decode(self, pc: int, statement: str):
        guard = re.match(r"@(!?)(%?\w+)\s+", statement)  # (inline asm names its own predicates)
        if guard:
            statement = statement[guard.end() :]
        parts = statement.split(None, 1)
        op, ops = parts[0], _split_operands(parts[1]) if len(parts) > 1 else []
        step = self._decode_op(pc, op, ops)
        if guard:
            negate, predicate = guard.group(1) == "!", guard.group(2)
            return lambda regs: step(regs) if bool(regs[predicate]) != negate else pc + 1
        return step

    def _decode_op(self, pc: int, op: str, ops: list):
        name, nxt = op.split(".")[0], pc + 1
        if name == "bra":
            target = self.k.labels[ops[0]]
            return lambda regs: target
        if name in ("ret", "exit"):
            return lambda regs: _EXIT
        if op == "trap":  # (the kernel's own check failed: the GPU aborts the launch)

            def trap(regs):
                raise TrapError(f"thread {regs['%tid.x']} of block {regs['%ctaid.x']} traps (statement {pc})")

            return trap
        if name in ("bar", "barrier"):
            return self._decode_barrier(op, ops, nxt)
        if name == "mbarrier":
            return self._decode_mbarrier(op, ops, nxt)
        if name == "wgmma":
            return self._decode_wgmma(op, ops, nxt)
        if re.fullmatch(r"fence\.proxy\.async(\.shared::(cta|cluster))?", op):
            return lambda regs: self._fence_proxy(regs["%tid.x"]) or nxt
        if op == "fence.proxy.async.global" or re.fullmatch(r"prefetch(\.param|\.const|\.global)?\.tensormap", op):
            return lambda regs: nxt  # (global memory is not checked; a prefetch changes nothing)
        if op == "elect.sync":
            return self._decode_elect(op, ops)
        if op == "fence.mbarrier_init.release.cluster" or name == "setmaxnreg":
            return lambda regs: nxt  # (the emulator's mbarriers exist once initialized; registers are not counted)
        if op in ("ex2.approx.f32", "ex2.approx.ftz.f32"):  # 2^x rounded to nearest (the GPU's is within 2 ulp)
            dst, src = ops[0], self._operand(ops[1])
            flush = ".ftz" in op

            def exp2(regs):
                x = _float(src(regs))
                if flush and abs(x) < 2.0**-126:
                    x = 0.0
                with np.errstate(over="ignore"):
                    regs[dst] = _bits(np.float32(np.exp2(np.float64(x))))
                return nxt

            return exp2
        if name in ("ld", "st"):
            return self._decode_memory(name, op, ops, nxt)
        if name == "cp":
            return self._decode_async_copy(op, ops, nxt)
        if name == "shfl":
            return self._decode_shuffle(op, ops)
        if name == "stmatrix":
            return self._decode_stmatrix(op, ops)
        if name == "ldmatrix":
            return self._decode_ldmatrix(pc, op, ops)
        if name == "mma":
            return self._decode_mma_sync(op, ops)
        if op == "vote.sync.any.pred":
            return self._decode_vote_any(op, ops)
        if name == "mov":
            if "{" in ops[0] + ops[1]:
                return self._decode_pack(op, ops, nxt)
            dst, src = ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, src(regs)) or nxt
        if name == "selp":
            dst, a, b, p = ops[0], self._operand(ops[1]), self._operand(ops[2]), ops[3]
            return lambda regs: regs.__setitem__(dst, a(regs) if regs[p] else b(regs)) or nxt
        if name == "cvta":  # (a struct parameter's generic address is its param-space one)
            if not re.search(r"\.(shared|global|param)\b", op):
                raise NotImplementedError(op)
            shift = 0 if ".shared" not in op else -_SHARED_WINDOW if ".to." in op else _SHARED_WINDOW
            dst, src = ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, src(regs) + shift) or nxt
        if op.endswith(".pred"):  # and, or, xor, not of predicates
            logic = {
                "and": lambda a, b: a and b,
                "or": lambda a, b: a or b,
                "xor": lambda a, b: a != b,
                "not": lambda a, b: not a,
            }
            if name not in logic:
                raise NotImplementedError(op)
            f, dst = logic[name], ops[0]
            x, y = self._operand(ops[1]), self._operand(ops[2]) if len(ops) > 2 else (lambda regs: False)
            return lambda regs: regs.__setitem__(dst, f(bool(x(regs)), bool(y(regs)))) or nxt
        if name == "cvt" and re.search(r"\.b?f16", op):
            return self._decode_half_convert(op, ops, nxt)
        if op == "cvt.rna.tf32.f32":  # to TF32 (10 fraction bits), ties away from zero
            dst, src = ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, _tf32_rna(src(regs))) or nxt
        if re.fullmatch(r"cvt\.rn\.f32\.[su]32", op):  # (an int32 is a double exactly: rounded once)
            dst, src, signed = ops[0], self._operand(ops[1]), ".s32" in op
            return lambda regs: (
                regs.__setitem__(dst, _bits(np.float32(_signed(src(regs), 32) if signed else src(regs) & 0xFFFFFFFF)))
                or nxt
            )
        if op == "rcp.rn.f32":
            dst, src = ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, _reciprocal(_float(src(regs)))) or nxt
        if name == "setp" and re.fullmatch(r"setp\.\w+\.f32", op):
            return self._decode_float_compare(op, ops, nxt)
        if name in ("atom", "red") and re.fullmatch(r"(atom|red)\.global\.add(\.v[24])?\.f32", op):
            return self._decode_float_add_to_global(name, op, ops, nxt)
        if re.fullmatch(r"red(\.release)?(\.gpu)?\.global\.add\.[su]32", op):  # (blocks run in turn: ordered)
            address, value = self._address(ops[0]), self._operand(ops[1])

            def add(regs):
                at, t = address(regs), regs["%tid.x"]
                self.store(t, "global", at, 4, (self.load(t, "global", at, 4) + value(regs)) & 0xFFFFFFFF)
                return nxt

            return add
        if re.search(r"\.(sat|cc|ftz|rz|rm|rp|rni|approx|full)\b", op) or name == "mad" and ".hi" in op:
            raise NotImplementedError(op)  # (saturation, carries, flushes, other roundings)
        if re.search(r"\.f(16|64)\b", op) or name == "setp" and ".f32" in op:
            raise NotImplementedError(op)
        if ".f32" in op:
            if name not in _FLOAT_OPS or name == "fma" and ".rn" not in op:
                raise NotImplementedError(op)
            f, dst = _FLOAT_OPS[name], ops[0]
            sources = [self._operand(t) for t in ops[1:]] + [lambda regs: 0] * (4 - len(ops))
            x, y, z = sources
            return lambda regs: regs.__setitem__(dst, f(_float(x(regs)), _float(y(regs)), _float(z(regs)))) or nxt
        if name in ("atom", "red", "vote", "mbarrier", "fence", "membar"):
            raise NotImplementedError(op)
        if name == "setp":
            m = re.fullmatch(r"setp\.(eq|ne|lt|le|gt|ge|lo|ls|hi|hs)\.([sub])(\d+)", op)
            if not m or len(ops) != 3:
                raise NotImplementedError(f"{op} {', '.join(ops)}")
            bits, signed = int(m.group(3)), m.group(2) == "s"
            compare = {
                "eq": "__eq__",
                "ne": "__ne__",
                "lt": "__lt__",
                "le": "__le__",
                "gt": "__gt__",
                "ge": "__ge__",
                "lo": "__lt__",
                "ls": "__le__",
                "hi": "__gt__",
                "hs": "__ge__",
            }[m.group(1)]
            dst, a, b = ops[0], self._operand(ops[1]), self._operand(ops[2])
            mask = (1 << bits) - 1
            if signed:
                return lambda regs: (
                    regs.__setitem__(dst, getattr(_signed(a(regs), bits), compare)(_signed(b(regs), bits))) or nxt
                )
            return lambda regs: regs.__setitem__(dst, getattr(a(regs) & mask, compare)(b(regs) & mask)) or nxt
        if name == "cvt":  # between integer widths: cvt.dst.src
            (_, dst_bits), (src_kind, src_bits) = _types(op)
            dst, src = ops[0], self._operand(ops[1])
            mask = (1 << dst_bits) - 1

            def convert(regs):
                x = src(regs)
                regs[dst] = (_signed(x, src_bits) if src_kind == "s" else x & ((1 << src_bits) - 1)) & mask
                return nxt

            return convert
        types = _types(op)
        if not types:
            raise NotImplementedError(op)
        kind, bits = types[-1]
        signed, mask = kind == "s", (1 << bits) - 1
        out_mask = (1 << (2 * bits)) - 1 if ".wide" in op else mask
        dst, sources = ops[0], [self._operand(t) for t in ops[1:]]
        if name == "bfi":  # bfi d, a, b, pos, len: b with bits [pos, pos + len) from a's low ones
            a, b, pos, length = sources

            def insert(regs):
                p, n = pos(regs) & 0xFF, length(regs) & 0xFF
                field = ((1 << n) - 1) << p & mask if p < bits else 0
                regs[dst] = ((b(regs) & ~field) | ((a(regs) << p) & field)) & mask
                return nxt

            return insert
        if name == "bfe" and not signed:  # bfe d, a, pos, len
            a, pos, length = sources

            def extract(regs):
                p, n = pos(regs) & 0xFF, length(regs) & 0xFF
                regs[dst] = ((a(regs) & mask) >> p) & ((1 << n) - 1) if p < bits else 0
                return nxt

            return extract
        f = _integer_op(name, op, bits, signed)
        sources = sources + [lambda regs: 0] * (3 - len(sources))
        x, y, z = sources
        return lambda regs: regs.__setitem__(dst, f(x(regs) & mask, y(regs) & mask, z(regs)) & out_mask) or nxt

    def _decode_pack(self, op: str, ops: list, nxt: int):
        """mov.b32 / mov.b64 between a register and {its parts} (b16 halves of a b32, b32
        halves of a b64), the first part the lowest bits; ``_`` drops a part."""
        m = re.fullmatch(r"mov\.b(32|64)", op)
        packing = ops[1].startswith("{") and not ops[0].startswith("{")
        parts = [r.strip() for r in (ops[1] if packing else ops[0]).strip("{}").split(",")]
        if not m or len(ops) != 2 or not (packing or ops[0].startswith("{")) or int(m.group(1)) % len(parts):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        bits = int(m.group(1)) // len(parts)
        mask = (1 << bits) - 1
        if packing:
            dst, sources = ops[0], [self._operand(r) for r in parts]

            def pack(regs):
                regs[dst] = sum((x(regs) & mask) << (i * bits) for i, x in enumerate(sources))
                return nxt

            return pack
        src = self._operand(ops[1])

        def unpack(regs):
            value = src(regs)
            for i, r in enumerate(parts):
                if r != "_":
                    regs[r] = (value >> (i * bits)) & mask
            return nxt

        return unpack

    def _decode_half_convert(self, op: str, ops: list, nxt: int):
        """cvt.rn.f16.f32 / .bf16.f32 and the x2 forms (the first source to the upper half,
        the second to the lower), rounded to nearest even; cvt.f32.f16 / .f32.bf16, exact."""
        m = re.fullmatch(r"cvt\.rn\.(b?f16)(x2)?\.f32", op)
        if m and len(ops) == 3 - (m.group(2) is None):
            rounded = _bf16 if m.group(1) == "bf16" else _f16
            dst, sources = ops[0], [self._operand(t) for t in ops[1:]]
            if len(sources) == 1:
                return lambda regs: regs.__setitem__(dst, rounded(sources[0](regs))) or nxt
            hi, lo = sources
            return lambda regs: regs.__setitem__(dst, rounded(hi(regs)) << 16 | rounded(lo(regs))) or nxt
        m = re.fullmatch(r"cvt\.f32\.(b?f16)", op)
        if m and len(ops) == 2:
            kind, dst, src = m.group(1), ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, _half_to_f32(kind, src(regs))) or nxt
        raise NotImplementedError(f"{op} {', '.join(ops)}")

    def _decode_memory(self, name: str, op: str, ops: list, nxt: int):
        space = next((s for s in ("shared", "global", "param", "local", "const") if f".{s}" in op), "")
        if space in ("local", "const"):
            raise NotImplementedError(op)
        size = _types(op)[-1][1] // 8
        vector = re.search(r"\.v(\d)", op)
        count = int(vector.group(1)) if vector else 1
        if space == "param":
            if name != "ld":
                raise NotImplementedError(op)
            name_only = ops[1].strip("[]").strip()
            if name_only in self.param_values:  # a scalar parameter
                dst, value = ops[0], self.param_values[name_only]
                mask = (1 << (8 * size)) - 1
                return lambda regs: regs.__setitem__(dst, value & mask) or nxt
            # fields of a struct parameter, as raw bits, at [struct + offset] or [register + offset]
            address, dsts = self._address(ops[1]), [r.strip() for r in ops[0].strip("{}").split(",")]
            blobs = {at: blob for at, blob in self.param_structs.values()}

            def load_fields(regs):
                at = address(regs)
                blob, offset = blobs[at & ~((1 << 32) - 1)], at & ((1 << 32) - 1)
                for i, dst in enumerate(dsts):
                    regs[dst] = int.from_bytes(blob[offset + i * size : offset + (i + 1) * size], "little")
                return nxt

            return load_fields
        registers = [r.strip() for r in (ops[0] if name == "ld" else ops[1]).strip("{}").split(",")]
        if len(registers) != count:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        address = self._address(ops[1] if name == "ld" else ops[0])
        pc = nxt - 1
        if name == "ld":

            def load(regs):
                at = address(regs)
                if self.log_shared:
                    self._log_shared(regs, pc, space, at, count * size)
                for i, r in enumerate(registers):
                    regs[r] = self.load(regs["%tid.x"], space, at + i * size, size)
                return nxt

            return load
        values = [self._operand(r) for r in registers]

        def store(regs):
            at = address(regs)
            if self.log_shared:
                self._log_shared(regs, pc, space, at, count * size)
            for i, v in enumerate(values):
                self.store(regs["%tid.x"], space, at + i * size, size, v(regs))
            return nxt

        return store

    def _log_shared(self, regs: dict, pc: int, space: str, at: int, size: int):
        """A lane's shared access, for bank_wavefronts: (lane, byte address, bytes) under
        (its warp, the statement), in the order the lane runs them."""
        if space == "shared" or space == "" and at >= _SHARED_WINDOW:
            t = regs["%tid.x"]
            lanes = self.shared_accesses.setdefault((t // 32, pc), {})
            lanes.setdefault(t, []).append((t % 32, at % _SHARED_WINDOW, size))

    def _decode_float_compare(self, op: str, ops: list, nxt: int):
        """setp.CMP.f32: ordered comparisons are false where either value is NaN, the
        unordered ones (equ, ltu, ...) true; num and nan test for NaNs."""
        cmp = op.split(".")[1]
        tests = {
            "eq": lambda a, b: a == b,
            "ne": lambda a, b: a != b,
            "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b,
            "gt": lambda a, b: a > b,
            "ge": lambda a, b: a >= b,
        }
        if len(ops) != 3 or "|" in ops[0]:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        if cmp in ("num", "nan"):

            def test(a, b):
                return (np.isnan(a) or np.isnan(b)) == (cmp == "nan")
        elif cmp in tests:

            def test(a, b):
                return not (np.isnan(a) or np.isnan(b)) and tests[cmp](a, b)
        elif cmp.endswith("u") and cmp[:-1] in tests:

            def test(a, b):
                return bool(np.isnan(a) or np.isnan(b)) or tests[cmp[:-1]](a, b)
        else:
            raise NotImplementedError(op)
        dst, x, y = ops[0], self._operand(ops[1]), self._operand(ops[2])
        return lambda regs: regs.__setitem__(dst, bool(test(_float(x(regs)), _float(y(regs))))) or nxt

    def _decode_float_add_to_global(self, name: str, op: str, ops: list, nxt: int):
        """atom / red .global.add.f32 (and red's .v2 / .v4): float32 adds into global memory,
        in the order the threads run (atom's first operand gets the value before)."""
        returns = name == "atom"
        address = self._address(ops[1] if returns else ops[0])
        values = [self._operand(r.strip()) for r in (ops[2] if returns else ops[1]).strip("{}").split(",")]

        def add(regs):
            at, t = address(regs), regs["%tid.x"]
            for i, value in enumerate(values):
                old = self.load(t, "global", at + 4 * i, 4)
                self.store(t, "global", at + 4 * i, 4, _bits(np.float32(_float(old) + _float(value(regs)))))
                if returns:
                    regs[ops[0]] = old
            return nxt

        return add

    def _decode_barrier(self, op: str, ops: list, nxt: int):
        """bar.sync / barrier.sync [id[, count]] (no count: the whole block), bar.arrive id,
        count (counts towards the barrier without waiting), bar.warp.sync (the warp's lanes)."""
        if op == "bar.warp.sync":
            return lambda regs: _WARP_SYNC
        m = re.fullmatch(r"(bar|barrier)\.(sync|arrive)(\.aligned)?", op)
        if not m or not 1 <= len(ops) <= 2 or m.group(2) == "arrive" and len(ops) != 2:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        barrier = self._operand(ops[0])
        count = self._operand(ops[1]) if len(ops) == 2 else (lambda regs: None)
        if m.group(2) == "arrive":
            return lambda regs: self._bar_arrive(regs["%tid.x"], barrier(regs), count(regs)) or nxt

        def wait(regs):
            regs["barrier"] = (barrier(regs), count(regs))
            return _BARRIER

        return wait

    def _decode_mbarrier(self, op: str, ops: list, nxt: int):
        """mbarrier init, arrive (a count of arrivals; its state operand: the phase),
        arrive.expect_tx and expect_tx (transaction bytes the phase also waits for; bulk
        copies' complete_tx count them down), try_wait.parity / test_wait.parity (a
        suspend-time hint changes nothing), with any .release / .acquire / .relaxed and
        .cta / .cluster (one block: the same)."""
        m = re.fullmatch(
            r"mbarrier\.(init|arrive|arrive\.expect_tx|expect_tx|try_wait\.parity|test_wait\.parity)"
            r"(\.(release|acquire|relaxed))?(\.(cta|cluster))?\.shared(::cta)?\.b64",
            op,
        )
        if not m:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        kind = m.group(1)
        if kind == "init":
            at, count = self._address(ops[0]), self._operand(ops[1])

            def init(regs):
                self.mbarriers[at(regs) % _SHARED_WINDOW] = _Mbarrier(count(regs), self.threads)
                return nxt

            return init
        if kind == "expect_tx":
            at, tx = self._address(ops[0]), self._operand(ops[1])

            def expect(regs):
                barrier = self._mbarrier(at(regs))
                barrier.tx += tx(regs)
                barrier.join(barrier.clock)  # (relaxed: it releases nothing)
                return nxt

            return expect
        if kind.startswith("arrive"):
            if len(ops) != 3 and (len(ops) != 2 or kind != "arrive"):
                raise NotImplementedError(f"{op} {', '.join(ops)}")
            state, at = ops[0], self._address(ops[1])
            tx = self._operand(ops[2]) if kind == "arrive.expect_tx" else (lambda regs: 0)
            count = self._operand(ops[2]) if kind == "arrive" and len(ops) == 3 else (lambda regs: 1)

            def arrive(regs):
                t = regs["%tid.x"]
                barrier = self._mbarrier(at(regs))
                if state != "_":
                    regs[state] = barrier.phase  # (opaque on the GPU; nothing here reads it)
                barrier.tx += tx(regs)
                barrier.arrive(self.clocks[t], count(regs))
                self.clocks[t][t] += 1
                return nxt

            return arrive
        if len(ops) not in (3, 4):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        dst, at, parity = ops[0], self._address(ops[1]), self._operand(ops[2])

        def try_wait(regs):
            barrier = self._mbarrier(at(regs))
            if barrier.phase % 2 == parity(regs) % 2:  # the phase of this parity is still to complete
                return _YIELD  # (tried again once the others have moved)
            t = regs["%tid.x"]
            np.maximum(self.clocks[t], barrier.completed, out=self.clocks[t])
            regs[dst] = True
            return nxt

        return try_wait

    def _mbarrier(self, address: int) -> "_Mbarrier":
        if address >= _SHARED_WINDOW:
            address -= _SHARED_WINDOW
        try:
            return self.mbarriers[address]
        except KeyError:
            raise KeyError(f"no mbarrier initialized at shared byte {address}") from None

    def _fence_proxy(self, thread: int):
        for word in self.unfenced[thread]:
            writer, written, readers, unfenced = self.words[word]
            if unfenced == thread:
                self.words[word] = (writer, written, readers, None)
        self.unfenced[thread] = set()

    def _decode_wgmma(self, op: str, ops: list, nxt: int):
        """wgmma.fence (nothing here), commit_group (closes this thread's group of issued
        wgmmas), wait_group N (retires all but the last N groups: their operands' reads end),
        and mma_async m64nNk8 TF32, which the warpgroup's 128 threads meet at (_wgmma)."""
        if op == "wgmma.fence.sync.aligned":
            return lambda regs: nxt
        if op == "wgmma.commit_group.sync.aligned":

            def commit(regs):
                groups = self.wgmma_groups[regs["%tid.x"]]
                groups.append([])
                return nxt

            return commit
        if op == "wgmma.wait_group.sync.aligned":
            keep = int(ops[0])

            def wait(regs):
                t = regs["%tid.x"]
                groups = self.wgmma_groups[t]
                closed = len(groups) - 1  # the last is the open one
                while closed > keep:
                    for read in groups.pop(0):
                        self._retire_reads(t, read)
                    closed -= 1
                return nxt

            return wait
        m = re.fullmatch(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(8|16)\.f32\.(tf32|f16|bf16)\.\3", op)
        if not m or (m.group(2) == "8") != (m.group(3) == "tf32"):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        n, kind = int(m.group(1)), m.group(3)
        from_registers = ops[1].startswith("{")
        # TF32: d, a, b, scale-d, scale-a, scale-b; 16-bit: then trans-a (not from registers), trans-b
        arity = 6 if kind == "tf32" else 7 if from_registers else 8
        if len(ops) != arity or n % 8 or not 8 <= n <= 256:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        immediates = [_immediate(t) for t in ops[4:]]
        scales, transposes = immediates[:2], immediates[2:]
        if any(x not in (1, -1) for x in scales) or any(x not in (0, 1) for x in transposes):
            raise NotImplementedError(f"{op} {', '.join(ops)}: scale-a/b +-1, trans-a/b 0 or 1 only")
        trans_a, trans_b = [0] * (2 - len(transposes)) + transposes  # (from registers: A as registers are)
        shape = (kind, 8 if kind == "tf32" else 16, scales[0] * scales[1], trans_a, trans_b)
        d_regs = [r.strip() for r in ops[0].strip("{}").split(",")]
        if len(d_regs) != n // 2:
            raise NotImplementedError(f"{op}: {len(d_regs)} accumulators")
        a = (
            [self._operand(r.strip()) for r in ops[1].strip("{}").split(",")]
            if from_registers
            else self._operand(ops[1])
        )
        b, scale_d = self._operand(ops[2]), self._operand(ops[3])

        def offer(regs):
            a_value = [x(regs) for x in a] if from_registers else a(regs)
            regs["wgmma"] = (
                nxt,
                n,
                d_regs,
                [regs.get(r, 0) for r in d_regs],
                from_registers,
                a_value,
                b(regs),
                bool(scale_d(regs)),
                shape,
            )
            return _WGMMA

        return offer

    def _bar_arrive(self, thread: int, barrier: int, count: int | None):
        state = self.named.setdefault(barrier, _NamedBarrier(self.threads))
        state.join(self.clocks[thread], count)
        self.clocks[thread][thread] += 1
        self._release_if_complete(barrier)

    def _decode_async_copy(self, op: str, ops: list, nxt: int):
        """cp.async: the source read at issue, the shared store checked then (its bytes may
        land from its issue on) and made by the wait_group (or wait_all) that completes its
        group, as the issuing thread's store; in between its words are in flight (_touch).
        cp.async.bulk (.tensor: _decode_tensor_copy) and its bulk groups."""
        if op == "cp.async.commit_group":
            return lambda regs: self.copy_groups[regs["%tid.x"]].append([]) or nxt
        if op in ("cp.async.wait_group", "cp.async.wait_all"):
            # wait_group N: all but the newest N committed groups; wait_all: every copy
            keep = int(ops[0]) if op == "cp.async.wait_group" else None

            def wait_copies(regs):
                t = regs["%tid.x"]
                groups = self.copy_groups[t]
                while len(groups) - 1 > (keep or 0) or keep is None and groups[0]:
                    for at, size, value in groups.pop(0):
                        self._land_copy(t, at, size, value)
                    if not groups:
                        groups.append([])
                return nxt

            return wait_copies
        if op.startswith("cp.async.bulk.tensor."):
            return self._decode_tensor_copy(op, ops, nxt)
        if op == "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32":
            dst, src, size = self._address(ops[0]), self._address(ops[1]), self._operand(ops[2])

            def bulk_reduce(regs):  # done at once; its reads of shared memory end at its wait_group(.read)
                t, n, at = regs["%tid.x"], size(regs), src(regs) % _SHARED_WINDOW
                if n % 16 or at % 16:
                    raise ValueError(f"bulk reduction of {n} bytes from shared byte {at}: not 16-byte multiples")
                read = _AsyncRead(list(range(at // 4, (at + n) // 4)), "a bulk reduction")
                self._async_reads(self.clocks[t], read)
                self.bulk_groups[t][-1].append(read)
                mem, where, _ = self._where("global", dst(regs), n)
                total = mem[where : where + n].view(np.float32) + self.shared[at : at + n].view(np.float32)
                mem[where : where + n] = total.astype(np.float32).view(np.uint8)
                return nxt

            return bulk_reduce
        if op == "cp.async.bulk.commit_group":
            return lambda regs: self.bulk_groups[regs["%tid.x"]].append([]) or nxt
        if re.fullmatch(r"cp\.async\.bulk\.wait_group(\.read)?", op):  # (stores are done at once: .read or not)
            keep = int(ops[0])

            def wait(regs):
                t = regs["%tid.x"]
                groups = self.bulk_groups[t]
                while len(groups) - 1 > keep:
                    for read in groups.pop(0):
                        self._retire_reads(t, read)
                return nxt

            return wait
        if op == "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes":
            dst, src, size, bar = (
                self._address(ops[0]),
                self._address(ops[1]),
                self._operand(ops[2]),
                self._address(ops[3]),
            )

            def bulk_copy(regs):  # done at once; its bytes complete the barrier's transaction
                t, n, to = regs["%tid.x"], size(regs), dst(regs)
                if to >= _SHARED_WINDOW:
                    to -= _SHARED_WINDOW
                mem, at, _ = self._where("global", src(regs), n)
                self._touch(t, to, n, True, proxy="async")
                if to + n > self.shared.size:
                    raise IndexError(f"shared access at {to} ({n} bytes) outside {self.shared.size}")
                self.shared[to : to + n] = mem[at : at + n]
                barrier = self._mbarrier(bar(regs))
                barrier.tx -= n
                barrier.join(self.clocks[t])
                return nxt

            return bulk_copy
        if not re.fullmatch(r"cp\.async\.c[ag]\.shared(::cta)?\.global(\.L2::\d+B)?", op) or len(ops) not in (3, 4):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        dst, src, size = self._address(ops[0]), self._address(ops[1]), int(ops[2])
        src_size = self._operand(ops[3]) if len(ops) == 4 else (lambda regs: size)

        def copy(regs):
            n, t, at = src_size(regs), regs["%tid.x"], dst(regs)
            if not 0 <= n <= size:
                raise ValueError(f"{op}: {n} source bytes of a {size}-byte copy")
            value = self.load(t, "global", src(regs), n) if n else 0  # (the rest zeros)
            self._where("shared", at, size)
            self._touch(t, at, size, True, record=False)  # (what its store may overwrite now)
            for word in range(at // 4, (at + size + 3) // 4):
                self.copying[word] = t
            self.copy_groups[t][-1].append((at, size, value))
            return nxt

        return copy

    def _land_copy(self, thread: int, at: int, size: int, value: int):
        """A cp.async's bytes, stored by its thread as a wait completes it."""
        for word in range(at // 4, (at + size + 3) // 4):
            del self.copying[word]
        self.store(thread, "shared", at, size, value)

    def _decode_tensor_copy(self, op: str, ops: list, nxt: int):
        """cp.async.bulk.tensor.Nd, a box of the tensor tensor_map describes: a load to shared
        memory (done at once; the box's bytes count down its mbarrier's transaction, zeros
        where the box leaves the tensor) or a store from it (its reads end at the
        wait_group.read that retires its bulk group; elements outside the tensor are not
        written). The shared side 128-byte aligned, the 128-byte swizzle on its absolute
        addresses. An L2 cache hint changes nothing."""
        load = re.fullmatch(
            r"cp\.async\.bulk\.tensor\.([1-5])d\.shared::(?:cluster|cta)\.global(\.tile)?"
            r"\.mbarrier::complete_tx::bytes(\.L2::cache_hint)?",
            op,
        )
        store = re.fullmatch(
            r"cp\.async\.bulk\.tensor\.([1-5])d\.global\.shared::cta(\.tile)?\.bulk_group(\.L2::cache_hint)?", op
        )
        m = load or store
        if not m or len(ops) != (3 if load else 2) + bool(m.group(3)):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        tensor = _split_operands(ops[1 if load else 0].strip()[1:-1])
        coords = [self._operand(c.strip()) for c in tensor[1].strip("{}").split(",")] if len(tensor) == 2 else []
        if len(coords) != int(m.group(1)):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        tensor_map, smem = self._operand(tensor[0]), self._address(ops[0] if load else ops[1])
        bar = self._address(ops[2]) if load else None

        def copy(regs):
            t, at = regs["%tid.x"], smem(regs) % _SHARED_WINDOW
            mem, offsets, inside, positions = self._tensor_box(
                tensor_map(regs), [_signed(c(regs), 32) for c in coords], at
            )
            n = positions.size
            if load:
                self._touch(t, at, n, True, proxy="async")
                self.shared[positions] = np.where(inside, mem[np.where(inside, offsets, 0)], 0)
                barrier = self._mbarrier(bar(regs))
                barrier.tx -= n
                barrier.join(self.clocks[t])
            else:
                read = _AsyncRead(list(range(at // 4, (at + n + 3) // 4)), "a bulk tensor store")
                self._async_reads(self.clocks[t], read)
                self.bulk_groups[t][-1].append(read)
                mem[offsets[inside]] = self.shared[positions[inside]]
            return nxt

        return copy

    def _tensor_box(self, address: int, coords: list, at: int):
        """The box at ``coords`` of the tensor map at ``address`` with shared memory at
        ``at``, byte by byte in the box's order: (the tensor's global bytes, each byte's
        offset there, whether it is inside the tensor, its shared address)."""
        if address % 64:
            raise ValueError(f"tensor map at {address:#x}: not 64-byte aligned")
        raw, where, _ = self._where("", address, 128)
        words = np.frombuffer(raw[where : where + 128].tobytes(), np.uint64)
        if int(words[0]) != _TENSOR_MAP_MAGIC:
            raise NotImplementedError(f"a tensor map at {address:#x} that tensor_map did not encode")
        rank, size, swizzle = int(words[2]) & 0xFF, int(words[2]) >> 8 & 0xFF, int(words[2]) >> 16
        dims, strides, box = (words[3 + 4 * i : 3 + 4 * i + rank].astype(np.int64) for i in range(3))
        if len(coords) != rank:
            raise ValueError(f"a {len(coords)}-d copy of a rank-{rank} tensor map")
        base = self._address_of(_TENSOR_ARRAYS[int(words[1])])
        if base % 16:
            raise ValueError(f"tensor map of an array at {base:#x}: not 16-byte aligned")
        if at % 128:
            raise ValueError(f"bulk tensor copy at shared byte {at}: not 128-byte aligned")
        index = np.indices(box[::-1]).reshape(rank, -1)[::-1]  # [dim, element]: innermost dim first
        where_ = np.asarray(coords, np.int64)[:, None] + index
        inside = ((where_ >= 0) & (where_ < dims[:, None])).all(axis=0)
        mem, origin, _ = self._where("global", base, 1)
        byte = np.arange(size)
        offsets = (origin + (where_ * strides[:, None]).sum(axis=0))[:, None] + byte
        if inside.any() and (offsets[inside].min() < 0 or offsets[inside].max() >= mem.size):
            raise IndexError(f"tensor map of an array at {base:#x}: its box reaches past the array")
        positions = at + np.arange(index.shape[1])[:, None] * size + byte
        if swizzle:  # (rows of 128 bytes, box[0] * size == 128)
            positions = positions ^ ((positions >> 7) & 7) << 4
        if positions.max() >= self.shared.size:
            raise IndexError(f"shared access at {at} ({positions.size} bytes) outside {self.shared.size}")
        return mem, offsets.reshape(-1), np.repeat(inside, size), positions.reshape(-1)

    def _decode_shuffle(self, op: str, ops: list):
        """shfl.sync over the whole warp: the lane stops with what it offers; the block
        exchanges once every lane of the warp is there (_exchange)."""
        m = re.fullmatch(r"shfl\.sync\.(bfly|down|idx)\.b32", op)
        if not m or len(ops) != 5:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        dst, _, predicate = ops[0].partition("|")
        value, lane_arg, clamp, member_mask = (self._operand(t) for t in ops[1:])
        mode = m.group(1)

        def offer(regs):
            if clamp(regs) & 0xFFFF != 31 or member_mask(regs) & 0xFFFFFFFF != 0xFFFFFFFF:
                raise NotImplementedError(f"{op} {', '.join(ops)}: only the whole warp, unclamped")
            regs["shuffle"] = (mode, value(regs), lane_arg(regs) & 31, dst.strip(), predicate.strip())
            return _SHUFFLE

        return offer

    def _decode_stmatrix(self, op: str, ops: list):
        """stmatrix.sync.aligned.m8n8.x4(.shared).b16 [a], {r0, r1, r2, r3}: a meeting of the
        warp's lanes (as a shuffle); row i of matrix j (8 x 8 b16) goes to the address of lane
        8j + i, its 16 bytes the words rj of lanes 4i..4i+3."""
        if not re.fullmatch(r"stmatrix\.sync\.aligned\.m8n8\.x4(\.shared(::cta)?)?\.b16", op) or len(ops) != 2:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        address = self._address(ops[0])
        words = [self._operand(r.strip()) for r in ops[1].strip("{}").split(",")]
        if len(words) != 4:
            raise NotImplementedError(f"{op} {', '.join(ops)}")

        space = "shared" if ".shared" in op else ""

        def offer(regs):
            regs["shuffle"] = ("stmatrix", (address(regs), [w(regs) for w in words], space), 0, "", "")
            return _SHUFFLE

        return offer

    def _decode_ldmatrix(self, pc: int, op: str, ops: list):
        """ldmatrix.sync.aligned.m8n8.xN(.trans)(.shared).b16 {r0, ..}, [a]: a meeting of the
        warp's lanes (as a shuffle). Lane l gives the address of row l % 8 of matrix l / 8
        (x1, x2: lanes 0-7, 0-15 only), 16 bytes (8 b16) read by that lane; every lane
        receives in rj the word (row l / 4, b16 columns 2 (l % 4), +1) of matrix j, with
        .trans of matrix j transposed (_exchange)."""
        m = re.fullmatch(r"ldmatrix\.sync\.aligned\.m8n8\.x([124])(\.trans)?(\.shared(::cta)?)?\.b16", op)
        dsts = [r.strip() for r in ops[0].strip("{}").split(",")] if ops else []
        if not m or len(ops) != 2 or len(dsts) != int(m.group(1)):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        address = self._address(ops[1])
        spec = (bool(m.group(2)), "shared" if m.group(3) else "", dsts, pc)

        def offer(regs):
            regs["shuffle"] = ("ldmatrix", address(regs), spec, "", "")
            return _SHUFFLE

        return offer

    def _decode_mma_sync(self, op: str, ops: list):
        """mma.sync.aligned m16n8k16 .row.col float32 += float16 / bfloat16 and m16n8k8
        float32 += TF32: a meeting of the warp's lanes (as a shuffle), each offering its A,
        B and C registers (_mma_sync)."""
        m = re.fullmatch(
            r"mma\.sync\.aligned\.(?:m16n8k16\.row\.col\.f32\.(b?f16)\.\1|m16n8k8\.row\.col\.f32\.(tf32)\.tf32)\.f32",
            op,
        )
        parts = [[r.strip() for r in x.strip("{}").split(",")] for x in ops]
        if not m or [len(x) for x in parts] != [4, 4, 2, 4]:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        kind, d_regs = m.group(1) or m.group(2), parts[0]
        a, b, c = ([self._operand(r) for r in x] for x in parts[1:])

        def offer(regs):
            regs["shuffle"] = ("mma", [[x(regs) for x in y] for y in (a, b, c)], (kind, d_regs), "", "")
            return _SHUFFLE

        return offer

    def _decode_elect(self, op: str, ops: list):
        """elect.sync d|p, membermask of the whole warp: a meeting of its lanes (as a
        shuffle), lane 0 elected."""
        if len(ops) != 2:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        dst, _, predicate = ops[0].partition("|")
        member_mask = self._operand(ops[1])

        def offer(regs):
            if member_mask(regs) & 0xFFFFFFFF != 0xFFFFFFFF:
                raise NotImplementedError(f"{op} {', '.join(ops)}: only the whole warp")
            regs["shuffle"] = ("elect", 0, 0, dst.strip(), predicate.strip())
            return _SHUFFLE

        return offer

    def _decode_vote_any(self, op: str, ops: list):
        """vote.sync.any.pred d, p, membermask of the whole warp: a meeting of its lanes (as
        a shuffle), d true in every lane where p is in any."""
        if len(ops) != 3:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        dst, vote, member_mask = ops[0], self._operand(ops[1]), self._operand(ops[2])

        def offer(regs):
            if member_mask(regs) & 0xFFFFFFFF != 0xFFFFFFFF:
                raise NotImplementedError(f"{op} {', '.join(ops)}: only the whole warp")
            regs["shuffle"] = ("any", bool(vote(regs)), 0, dst, "")
            return _SHUFFLE

        return offer

    # execution -----------------------------------------------------------------
    def _exchange(self, lanes: list):
        offers = [regs.pop("shuffle") for regs in lanes]
        if offers[0][0] == "stmatrix":
            for j in range(4):
                for i in range(8):
                    (at, _, space), lane = offers[8 * j + i][1], lanes[8 * j + i]
                    row = sum((offers[4 * i + q][1][1][j] & 0xFFFFFFFF) << (32 * q) for q in range(4))
                    self.store(lane["%tid.x"], space, at, 16, row)
            return
        if offers[0][0] == "ldmatrix":
            return self._ldmatrix(lanes, offers)
        if offers[0][0] == "mma":
            return self._mma_sync(lanes, offers)
        for lane, (regs, (mode, _, b, dst, predicate)) in enumerate(zip(lanes, offers)):
            if mode == "any":
                regs[dst] = any(offer[1] for offer in offers)
                continue
            if mode == "elect":  # (the whole warp: lane 0 is elected)
                if dst not in ("", "_"):
                    regs[dst] = 0
                if predicate not in ("", "_"):
                    regs[predicate] = lane == 0
                continue
            source = lane ^ b if mode == "bfly" else lane + b if mode == "down" else b
            valid = source < 32
            regs[dst] = offers[source if valid else lane][1]
            if predicate:
                regs[predicate] = valid

    def _ldmatrix(self, lanes: list, offers: list):
        """The warp's ldmatrix: each row read by the lane that gives its address (a shared
        load, its races and uninitialized words as any), then handed out (_decode_ldmatrix)."""
        trans, space, dsts, pc = offers[0][2]
        rows = np.zeros((len(dsts), 8, 8), np.uint16)  # [matrix, row, b16 column]
        for lane in range(8 * len(dsts)):
            regs, at = lanes[lane], offers[lane][1]
            if at % 16:
                raise ValueError(f"ldmatrix: lane {lane}'s row address {at:#x} is not 16-byte aligned")
            if space == "" and at < _SHARED_WINDOW:
                raise IndexError(f"ldmatrix: lane {lane}'s row address {at:#x} is not in shared memory")
            if self.log_shared:
                self._log_shared(regs, pc, "shared", at, 16)
            value = self.load(regs["%tid.x"], space, at, 16)
            rows[lane // 8, lane % 8] = np.frombuffer(value.to_bytes(16, "little"), np.uint16)
        if trans:
            rows = rows.transpose(0, 2, 1)
        lane = np.arange(32)
        lo, hi = (rows[:, lane // 4, 2 * (lane % 4) + e].astype(np.uint32) for e in (0, 1))
        words = lo | hi << np.uint32(16)  # [matrix, lane]
        for lane, regs in enumerate(lanes):
            for j, dst in enumerate(dsts):
                regs[dst] = int(words[j, lane])

    def _mma_sync(self, lanes: list, offers: list):
        """The warp's mma.sync: d = A B + C, A 16 x k row-major, B k x 8 column-major (as
        B^T, 8 x k, its rows), C and d 16 x 8; each lane's registers as the PTX ISA's
        fragments (kernels/mma.cuh's header), computed as _wgmma computes (_fragment,
        _accumulate)."""
        kind, d_regs = offers[0][2]
        k = 8 if kind == "tf32" else 16
        a_words, b_words, c_words = (
            np.array([o[1][i] for o in offers], dtype=np.uint64).astype(np.uint32) for i in range(3)
        )
        lane = np.arange(32)
        g, t = lane // 4, lane % 4
        # A: register i of lane (g, t) holds row g + 8 (i % 2), the k-half i / 2; B^T: register
        # i row g, the k-half i
        a = self._fragment(kind, a_words, g[:, None] + 8 * (np.arange(4) % 2), np.arange(4) // 2, k, 16)
        b = self._fragment(kind, b_words, np.repeat(g[:, None], 2, axis=1), np.arange(2), k, 8)
        # C, d: element e of lane (g, t) at row g + 8 (e / 2), column 2 t + e % 2
        e = np.arange(4)
        product = (a @ b.T)[g[:, None] + 8 * (e // 2), 2 * t[:, None] + e % 2]
        new = self._accumulate(c_words, product, True)
        for j, regs in enumerate(lanes):
            for r, value in zip(d_regs, new[j]):
                regs[r] = int(value)

    @classmethod
    def _fragment(cls, kind: str, words: np.ndarray, rows: np.ndarray, halves: np.ndarray, k: int, m: int):
        """Values [m, k] of an operand in the lanes' registers: register i of lane l (t = l %
        4), ``words[l, i]``, holds row ``rows[l, i]`` at k = ``halves[i]`` k / 2 + t (TF32: one
        element a word) or + 2 t + e (16-bit: two, e = 0 the lower half). The lanes of a warp
        (mma.sync) or of a warpgroup (wgmma's A from registers)."""
        per = 1 if kind == "tf32" else 2
        t = np.arange(words.shape[0])[:, None] % 4
        x = np.zeros((m, k))
        for e in range(per):
            bits = words >> np.uint32(16 * e) & np.uint32(0xFFFF) if per == 2 else words
            x[rows, k // 2 * halves[None, :] + per * t + e] = cls._element_values(kind, bits)
        return x

    @staticmethod
    def _accumulate(old: np.ndarray, product: np.ndarray, scale_d: bool) -> np.ndarray:
        """float32 accumulators' bits after adding exact float64 ``product``s to them (or,
        scale_d false, replacing them), rounded once to float32."""
        new = old.view(np.float32).astype(np.float64) + product if scale_d else product
        return new.astype(np.float32).view(np.uint32)

    def _operand_bytes(self, desc: int, rows: int, k: int, size: int, mn_major: bool) -> np.ndarray:
        """Shared byte addresses of a wgmma operand of ``rows`` x ``k`` elements of ``size``
        bytes through its descriptor, [row, k]. Layout 0 (no swizzle), K-major: 8-row x
        16-byte core matrices, the leading byte offset steps 16 bytes of k, the stride byte
        offset 8 rows. Layout 1 (128-byte swizzle): rows of 128 bytes; K-major, 8 rows
        apart by the stride byte offset, k within the row; MN-major, 128 bytes of the row
        dimension per k, 8 k apart by the stride byte offset, the next 128 bytes of rows by
        the leading one; then bits 4-6 of each absolute address XOR bits 7-9, as the
        hardware does (a tile whose base is not 1024-aligned reads permuted elements)."""
        layout, base = desc >> 62, (desc >> 49) & 7
        if layout not in (0, 1) or base:
            raise NotImplementedError(f"wgmma descriptor {desc:#x}: 32- or 64-byte swizzle, or a base offset")
        start, leading, stride = (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4
        r, c = np.meshgrid(np.arange(rows), np.arange(k), indexing="ij")
        per16, per128 = 16 // size, 128 // size
        if layout == 0:
            if mn_major:
                raise NotImplementedError(f"wgmma descriptor {desc:#x}: MN-major without swizzle")
            at = start + (c // per16) * leading + (r // 8) * stride + (r % 8) * 16 + (c % per16) * size
        else:
            if mn_major:
                at = start + (r // per128) * leading + (r % per128) * size + (c // 8) * stride + (c % 8) * 128
            elif start % 128 + k * size > 128:
                raise NotImplementedError(f"wgmma descriptor {desc:#x}: k past its 128-byte row")
            else:
                at = start + (r // 8) * stride + (r % 8) * 128 + c * size
            at = at ^ ((at >> 7) & 7) << 4
        if at.max() + size > self.shared.size:
            raise IndexError(f"wgmma operand at shared bytes {at.min()}..{at.max() + size} outside {self.shared.size}")
        return at

    @staticmethod
    def _element_values(kind: str, bits: np.ndarray) -> np.ndarray:
        """Operand elements' values (exact in float64): TF32, a word's top 19 bits (what
        the tensor cores read); float16; bfloat16, the top half of a float32."""
        if kind == "tf32":
            return (bits.astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
        if kind == "f16":
            return bits.astype(np.uint16).view(np.float16).astype(np.float64)
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)

    def _shared_operand(self, kind: str, desc: int, rows: int, k: int, mn_major: bool):
        """(values [rows, k], the shared words read) of an operand through its descriptor."""
        size = 4 if kind == "tf32" else 2
        at = self._operand_bytes(desc, rows, k, size, mn_major)
        bits = self.shared.view(np.uint32 if size == 4 else np.uint16)[at // size]
        return self._element_values(kind, bits), np.unique(at // 4)

    def _wgmma(self, lanes: list, threads: list):
        """The warpgroup's wgmma (its 128 threads' offers): d = A B^T (+ d), m64nNk8 (TF32)
        or m64nNk16 (float16, bfloat16), A 64 x K from shared memory or from the lanes'
        registers, B N x K from shared memory (imm-trans 1: MN-major); d in wgmma.cuh's
        accumulator layout. Products exact in float64, summed there, added to the float32
        accumulators and rounded once. Its operands' words are read until a wait_group
        retires them."""
        offers = [regs.pop("wgmma") for regs in lanes]
        _, n, d_regs, _, from_registers, a0, b_desc, scale_d, shape = offers[0]
        kind, k, sign, trans_a, trans_b = shape
        if any(o[6] != b_desc or o[7] != scale_d or (not from_registers and o[5] != a0) for o in offers):
            raise NotImplementedError("a wgmma whose descriptors differ between its lanes")
        lane = np.arange(128)
        w, g, t = lane // 32, lane % 32 // 4, lane % 4
        b, b_words = self._shared_operand(kind, b_desc, n, k, bool(trans_b))
        if from_registers:
            # register i of lane (g, t), warp w: row 16 w + g + 8 (i % 2), the k-half i / 2 (as mma.sync's A)
            words = np.array([o[5] for o in offers], dtype=np.uint64).astype(np.uint32)
            rows = (16 * w + g)[:, None] + 8 * (np.arange(4) % 2)
            a = self._fragment(kind, words, rows, np.arange(4) // 2, k, 64)
            a_words = np.zeros(0, dtype=np.int64)
        else:
            a, a_words = self._shared_operand(kind, a0, 64, k, bool(trans_a))
        # d[j][e] of lane (g, t), warp w: row 16 w + g + 8 (e / 2), column 8 j + 2 t + e % 2
        i = np.arange(n // 2)
        rows = 16 * w[:, None] + g[:, None] + 8 * (i[None, :] % 4 // 2)
        cols = 8 * (i[None, :] // 4) + 2 * t[:, None] + i[None, :] % 2
        old = np.array([o[3] for o in offers], dtype=np.uint64).astype(np.uint32)
        new = self._accumulate(old, sign * (a @ b.T)[rows, cols], scale_d)
        for j, regs in enumerate(lanes):
            for r, value in zip(d_regs, new[j]):
                regs[r] = int(value)
        read = _AsyncRead(np.concatenate([a_words.reshape(-1), b_words.reshape(-1)]).tolist())
        self._async_reads(self.clocks[threads].max(axis=0), read)
        for t in threads:  # each thread retires it with its wait_group (warp-wide: every lane waits)
            self.wgmma_groups[t][-1].append(read)

    def _release_if_complete(self, barrier: int):
        state = self.named.get(barrier)
        if state is None or not state.arrived:
            return
        expected = state.count if state.count is not None else sum(stop != _EXIT for stop in self.stops)
        if state.arrived > expected:
            raise DeadlockError(f"barrier {barrier}: {state.arrived} threads arrived, {expected} expected")
        if state.arrived < expected:
            return
        for t in state.waiting:
            np.maximum(self.clocks[t], state.clock, out=self.clocks[t])
            self.clocks[t][t] += 1
            self.pcs[t], self.stops[t] = self.pcs[t] + 1, None
        del self.named[barrier]

    def _where_each_waits(self) -> str:
        places = {}
        for t, (pc, stop) in enumerate(zip(self.pcs, self.stops)):
            if stop != _EXIT:
                places.setdefault((stop, self.k.statements[pc]), []).append(t)
        return "; ".join(
            f"threads {ts[0]}..{ts[-1]} ({len(ts)}) at {stop}: {statement}" for (stop, statement), ts in places.items()
        )

    def run_block(self, block: int):
        self.shared = np.full(self.shared_bytes, 0xFF, dtype=np.uint8)  # (not zeros: nothing relies on them)
        n = self.threads
        self.clocks = np.eye(n, dtype=np.int64)  # thread t's vector clock: row t
        self.words, self.in_flight, self.unfenced = {}, {}, [set() for _ in range(n)]
        self.mbarriers, self.named, self.shared_accesses = {}, {}, {}
        self.wgmma_groups = [[[]] for _ in range(n)]  # committed groups, then the open one
        self.bulk_groups = [[[]] for _ in range(n)]  # (bulk tensor stores' reads, alike)
        self.copy_groups = [[[]] for _ in range(n)]  # cp.async copies (at, bytes, value), alike
        self.copying = {}  # shared word -> the thread whose cp.async to it is in flight
        specials = {
            "%ntid.x": n,
            "%ntid.y": 1,
            "%ntid.z": 1,
            "%tid.y": 0,
            "%tid.z": 0,
            "%ctaid.x": block,
            "%ctaid.y": 0,
            "%ctaid.z": 0,
            "%nctaid.x": self.blocks,
            "%nctaid.y": 1,
            "%nctaid.z": 1,
            "%dynamic_smem_size": self.dynamic_shared,
        }
        threads = [dict(specials, **{"%tid.x": t, "%laneid": t % 32, "%warpid": t // 32}) for t in range(n)]
        self.pcs, self.stops = [0] * n, [None] * n
        pcs, stops, steps = self.pcs, self.stops, self.steps
        while True:
            moved = False
            for t, regs in enumerate(threads):
                if stops[t] is not None:
                    continue
                pc, steps_run = pcs[t], 0
                while True:
                    nxt = steps[pc](regs)
                    if isinstance(nxt, str):
                        break
                    pc, steps_run = nxt, steps_run + 1
                pcs[t], stops[t] = pc, nxt  # at the statement it stopped at
                moved = moved or nxt != _YIELD or steps_run > 0
                if nxt == _BARRIER:
                    barrier, count = regs.pop("barrier")
                    state = self.named.setdefault(barrier, _NamedBarrier(n))
                    state.join(self.clocks[t], count)
                    state.waiting.append(t)
                    self._release_if_complete(barrier)
                elif nxt == _EXIT:
                    for barrier in [b for b, state in self.named.items() if state.count is None]:
                        self._release_if_complete(barrier)
            for w in range(0, n, 32):
                warp = range(w, w + 32)
                if all(stops[t] == _SHUFFLE for t in warp) or all(stops[t] == _WARP_SYNC for t in warp):
                    if len({pcs[t] for t in warp}) > 1:
                        raise NotImplementedError(f"warp {w // 32}'s lanes at different shuffles or __syncwarps")
                    if stops[w] == _SHUFFLE:
                        self._exchange(threads[w : w + 32])
                    joined = self.clocks[w : w + 32].max(axis=0)
                    for t in warp:
                        np.maximum(self.clocks[t], joined, out=self.clocks[t])
                        self.clocks[t][t] += 1
                        pcs[t], stops[t] = pcs[t] + 1, None
                    moved = True
            for w in range(0, n - 127, 128):
                group = range(w, w + 128)
                if all(stops[t] == _WGMMA for t in group):
                    if len({pcs[t] for t in group}) > 1:
                        raise NotImplementedError(f"warpgroup {w // 128}'s threads at different wgmmas")
                    self._wgmma(threads[w : w + 128], list(group))
                    for t in group:
                        pcs[t], stops[t] = pcs[t] + 1, None
                    moved = True
            if all(stop == _EXIT for stop in stops):
                for t, groups in enumerate(self.wgmma_groups):
                    if any(groups):
                        raise RaceError(f"thread {t} ends with wgmma reads not retired by a wait_group")
                for t, groups in enumerate(self.bulk_groups):
                    if any(groups):
                        raise RaceError(f"thread {t} ends with bulk store reads not retired by a wait_group.read")
                for t, groups in enumerate(self.copy_groups):
                    if any(groups):
                        raise RaceError(f"thread {t} ends with cp.async copies that no wait completed")
                return
            for t in range(n):
                if stops[t] == _YIELD:
                    stops[t] = None  # (its mbarrier wait, again)
            if not moved:
                raise DeadlockError("no thread can move: " + self._where_each_waits())


class _AsyncRead:
    """The shared words one wgmma (or bulk store) reads, and (thread, its clock) at each
    wait_group that retired it."""

    def __init__(self, words: list, what: str = "a wgmma"):
        self.words, self.observed, self.what = words, [], what


class _NamedBarrier:
    """A barrier's arrivals so far (bar.sync's waiting threads and bar.arrive's), their
    clocks joined."""

    def __init__(self, threads: int):
        self.arrived, self.count, self.waiting = 0, None, []
        self.clock = np.zeros(threads, dtype=np.int64)

    def join(self, clock: np.ndarray, count: int | None):
        if self.arrived and count != self.count:
            raise NotImplementedError(f"a barrier's threads name different counts: {self.count}, {count}")
        self.count, self.arrived = count, self.arrived + 1
        np.maximum(self.clock, clock, out=self.clock)


class _Mbarrier:
    """An mbarrier: its current phase completes once ``count`` arrivals and the bytes they
    expect (expect_tx; bulk copies count them down) are in; ``completed`` is the clock
    that the phase released (what a wait acquires)."""

    def __init__(self, count: int, threads: int):
        self.count = self.pending = count
        self.tx, self.phase = 0, 0
        self.clock = np.zeros(threads, dtype=np.int64)
        self.completed = np.zeros(threads, dtype=np.int64)

    def arrive(self, clock: np.ndarray, count: int = 1):
        self.pending -= count
        if self.pending < 0:
            raise DeadlockError(f"more arrivals at an mbarrier in one phase than its {self.count}")
        self.join(clock)

    def join(self, clock: np.ndarray):
        np.maximum(self.clock, clock, out=self.clock)
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.completed, self.clock = self.clock, np.zeros_like(self.clock)
            self.pending = self.count
