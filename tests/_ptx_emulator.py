"""A compiled kernel's PTX run on the CPU, block after block, so that device code that
computes addresses, moves words and does float32 arithmetic (wgmma_tiles.cuh's
rearrangements, the staging launches, ...) is checked as the compiler built it, where
no GPU is at hand.

A block's threads run one after another, each up to its next meeting point: the block's
barrier (bar.sync with no thread count) or its warp's shuffle (shfl.sync, the whole
warp), where the lanes exchange values once all are there. A 4-byte word of shared
memory that two threads touch between two barriers, one of them storing, is a race
(RaceError; global memory is not checked). Emulated: integer and predicate arithmetic,
branches, loads and stores, cp.async (done at once: its waits pass), float32 add, sub,
mul and fma rounded to nearest even as the GPU rounds them (no flush to zero), TF32
rounding (cvt.rna.tf32.f32); anything else (other float operations, atomics, named
barriers with a count, ...) raises NotImplementedError naming the instruction, so a
kernel never runs partly emulated. Global memory is the kernel's array arguments, each
at its own address; shared memory starts as 0xFF bytes (NaN), not zeros.
"""

import re
import struct
from fractions import Fraction

import numpy as np

_GLOBAL_BASE = 1 << 40  # argument i's array at (i + 1) << 40: no two overlap
_SHARED_WINDOW = 1 << 56  # generic addresses of shared memory (cvta)
_BARRIER, _SHUFFLE, _EXIT = "barrier", "shuffle", "exit"  # where a thread stops


class RaceError(AssertionError):
    pass


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


def _float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def _nearest_f32(exact: Fraction, guess: float) -> np.float32:
    """``exact`` rounded to float32, nearest and ties to even, from ``guess`` within an ulp."""
    f = np.float32(guess)
    if not np.isfinite(f):
        return f
    candidates = [c for c in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf)))
                  if np.isfinite(c)]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))


def _fma(a: float, b: float, c: float) -> int:
    """fma.rn.f32: a * b + c rounded once."""
    if not all(np.isfinite((a, b, c))):
        return _bits(np.float32(a * b + c))
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:  # (the sign of zero as IEEE gives it; a double rounds nothing here)
        return _bits(np.float32(a * b + c))
    return _bits(_nearest_f32(exact, float(exact)))


def _tf32_rna(bits: int) -> int:
    """cvt.rna.tf32.f32: the magnitude rounded half up at bit 13 (a carry may reach the
    exponent, as rounding up should), the low 13 bits cleared."""
    bits &= 0xFFFFFFFF
    if bits & 0x7F800000 == 0x7F800000:
        if bits & 0x7FFFFF:
            raise NotImplementedError("cvt.rna.tf32.f32 of a NaN")
        return bits
    return (bits + 0x1000) & 0xFFFFE000


# float32 operations on the operands' values (Python floats, exact): add, sub and mul
# rounded once in double, then to float32, are rounded as once to float32 (53 >= 2 x 24 + 2).
_FLOAT_OPS = {"add": lambda a, b, c: _bits(np.float32(a + b)), "sub": lambda a, b, c: _bits(np.float32(a - b)),
              "mul": lambda a, b, c: _bits(np.float32(a * b)), "fma": _fma,
              "neg": lambda a, b, c: _bits(np.float32(-a)), "abs": lambda a, b, c: _bits(np.float32(abs(a)))}


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
    simple = {"add": lambda a, b, c: a + b, "sub": lambda a, b, c: a - b, "shl": lambda a, b, c: a << min(b, bits),
              "and": lambda a, b, c: a & b, "or": lambda a, b, c: a | b, "xor": lambda a, b, c: a ^ b,
              "not": lambda a, b, c: ~a, "neg": lambda a, b, c: -a}
    if name in simple:
        return simple[name]
    raise NotImplementedError(op)


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
        self.params = re.findall(r"\.param\s+\.\w+\s+(\w+)", m.group(1))
        body, depth, i = [], 1, m.end()
        while depth:  # the entry's braces (inline asm adds scopes of its own)
            ch = ptx[i]
            depth += ch == "{"
            depth -= ch == "}"
            body.append(ch)
            i += 1
        # Shared arrays: the static ones one after another, the dynamic one (extern) after them.
        self.shared_symbols, self.static_shared, dynamic = {}, 0, []
        for extern, align, name, size in re.findall(
                r"(\.extern\s+)?\.shared\s+\.align\s+(\d+)\s+\.\w+\s+(\w+)\[(\d*)\]", ptx):
            if extern:
                dynamic.append((int(align), name))
                continue
            self.static_shared = -(-self.static_shared // int(align)) * int(align)
            self.shared_symbols[name] = self.static_shared
            self.static_shared += int(size)
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
                statement = statement[label.end():]
            if statement and not statement.startswith("."):  # (declarations: .reg, ...)
                self.statements.append(statement)

    def run(self, threads: int, args: list, shared_bytes: int = 0, blocks: int = 1) -> list:
        """Run ``blocks`` blocks (x only) of ``threads`` threads with ``args``, one block
        after another: for a pointer, a contiguous numpy array or (array, byte offset)
        (read and written in place; the same array twice is one allocation), else an int.
        ``shared_bytes``: the dynamic shared memory. Returns ``args``."""
        grid = _Grid(self, threads, args, shared_bytes, blocks)
        for block in range(blocks):
            grid.run_block(block)
        return args


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
        for i, (name, arg) in enumerate(zip(kernel.params, args)):
            array, offset = arg if isinstance(arg, tuple) else (arg, 0)
            if isinstance(array, np.ndarray):
                if not array.flags.c_contiguous:
                    raise ValueError(f"argument {i}: a contiguous array (or one and a byte offset)")
                if id(array) not in self.arrays:
                    self.arrays[id(array)] = ((len(self.arrays) + 1) * _GLOBAL_BASE, array.reshape(-1).view(np.uint8))
                self.param_values[name] = self.arrays[id(array)][0] + offset
            else:
                self.param_values[name] = int(arg)
        self.steps = [self._decode(pc, s) for pc, s in enumerate(kernel.statements)]

    # memory ------------------------------------------------------------------
    def _where(self, space: str, address: int, size: int):
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

    def _touch(self, thread: int, address: int, size: int, stored: bool):
        for word in range(address // 4, (address + size + 3) // 4):
            epoch, writer, reader = self.touched.get(word, (-1, None, None))
            if epoch != self.epoch:
                writer, reader = None, None
            if writer is not None and writer != thread or stored and reader is not None and reader != thread:
                raise RaceError(f"shared word at byte {4 * word}: thread {thread} {'stores' if stored else 'loads'} "
                                f"it, another {'stored' if writer is not None else 'loaded'} it since the last "
                                "barrier")
            if stored:
                writer = thread
            else:
                reader = thread if reader in (None, thread) else -1
            self.touched[word] = (self.epoch, writer, reader)

    def load(self, thread: int, space: str, address: int, size: int) -> int:
        mem, at, shared = self._where(space, address, size)
        if shared:
            self._touch(thread, at, size, False)
        return int.from_bytes(mem[at:at + size].tobytes(), "little")

    def store(self, thread: int, space: str, address: int, size: int, value: int):
        mem, at, shared = self._where(space, address, size)
        if shared:
            self._touch(thread, at, size, True)
        mem[at:at + size] = np.frombuffer((value & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), np.uint8)

    # decoding ----------------------------------------------------------------
    def _operand(self, token: str):
        """regs -> the operand's value (regs["%tid.x"] etc. hold the thread's specials)."""
        imm = _immediate(token)
        if imm is not None:
            return lambda regs: imm
        if token in self.k.shared_symbols:
            at = self.k.shared_symbols[token]
            return lambda regs: at
        if token.startswith("%"):
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
        guard = re.match(r"@(!?)(%\w+)\s+", statement)
        if guard:
            statement = statement[guard.end():]
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
        if name in ("bar", "barrier"):
            if op not in ("bar.sync", "barrier.sync", "barrier.sync.aligned") or len(ops) != 1:
                raise NotImplementedError(f"{op} {', '.join(ops)} (only the whole block's barrier)")
            return lambda regs: _BARRIER
        if name in ("ld", "st"):
            return self._decode_memory(name, op, ops, nxt)
        if name == "cp":
            return self._decode_async_copy(op, ops, nxt)
        if name == "shfl":
            return self._decode_shuffle(op, ops)
        if name == "mov":
            if "{" in ops[0] + ops[1]:
                raise NotImplementedError(f"{op} {', '.join(ops)} (vector moves)")
            dst, src = ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, src(regs)) or nxt
        if name == "selp":
            dst, a, b, p = ops[0], self._operand(ops[1]), self._operand(ops[2]), ops[3]
            return lambda regs: regs.__setitem__(dst, a(regs) if regs[p] else b(regs)) or nxt
        if name == "cvta":
            if ".shared" not in op and ".global" not in op:
                raise NotImplementedError(op)
            shift = 0 if ".global" in op else -_SHARED_WINDOW if ".to." in op else _SHARED_WINDOW
            dst, src = ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, src(regs) + shift) or nxt
        if op.endswith(".pred"):  # and, or, xor, not of predicates
            logic = {"and": lambda a, b: a and b, "or": lambda a, b: a or b, "xor": lambda a, b: a != b,
                     "not": lambda a, b: not a}
            if name not in logic:
                raise NotImplementedError(op)
            f, dst = logic[name], ops[0]
            x, y = self._operand(ops[1]), self._operand(ops[2]) if len(ops) > 2 else (lambda regs: False)
            return lambda regs: regs.__setitem__(dst, f(bool(x(regs)), bool(y(regs)))) or nxt
        if op == "cvt.rna.tf32.f32":  # to TF32 (10 fraction bits), ties away from zero
            dst, src = ops[0], self._operand(ops[1])
            return lambda regs: regs.__setitem__(dst, _tf32_rna(src(regs))) or nxt
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
            compare = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__",
                       "ge": "__ge__", "lo": "__lt__", "ls": "__le__", "hi": "__gt__", "hs": "__ge__"}[m.group(1)]
            dst, a, b = ops[0], self._operand(ops[1]), self._operand(ops[2])
            mask = (1 << bits) - 1
            if signed:
                return lambda regs: regs.__setitem__(
                    dst, getattr(_signed(a(regs), bits), compare)(_signed(b(regs), bits))) or nxt
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
            dst, value = ops[0], self.param_values[ops[1].strip("[]").strip()]
            mask = (1 << (8 * size)) - 1
            return lambda regs: regs.__setitem__(dst, value & mask) or nxt
        registers = [r.strip() for r in (ops[0] if name == "ld" else ops[1]).strip("{}").split(",")]
        if len(registers) != count:
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        address = self._address(ops[1] if name == "ld" else ops[0])
        if name == "ld":
            def load(regs):
                at = address(regs)
                for i, r in enumerate(registers):
                    regs[r] = self.load(regs["%tid.x"], space, at + i * size, size)
                return nxt
            return load
        values = [self._operand(r) for r in registers]

        def store(regs):
            at = address(regs)
            for i, v in enumerate(values):
                self.store(regs["%tid.x"], space, at + i * size, size, v(regs))
            return nxt
        return store

    def _decode_async_copy(self, op: str, ops: list, nxt: int):
        """cp.async's copy done at once (a shared store now: the waits that follow pass);
        its groups and waits, nothing."""
        if re.fullmatch(r"cp\.async\.(commit_group|wait_group|wait_all)", op):
            return lambda regs: nxt
        if not re.fullmatch(r"cp\.async\.c[ag]\.shared(::cta)?\.global(\.L2::\d+B)?", op) or len(ops) not in (3, 4):
            raise NotImplementedError(f"{op} {', '.join(ops)}")
        dst, src, size = self._address(ops[0]), self._address(ops[1]), int(ops[2])
        src_size = self._operand(ops[3]) if len(ops) == 4 else (lambda regs: size)

        def copy(regs):
            n, t = src_size(regs), regs["%tid.x"]
            data = [self.load(t, "global", src(regs) + i, 1) for i in range(n)] + [0] * (size - n)
            self.store(t, "shared", dst(regs), size, int.from_bytes(bytes(data), "little"))
            return nxt
        return copy

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

    # execution -----------------------------------------------------------------
    @staticmethod
    def _exchange(lanes: list):
        offers = [regs.pop("shuffle") for regs in lanes]
        for lane, (regs, (mode, _, b, dst, predicate)) in enumerate(zip(lanes, offers)):
            source = lane ^ b if mode == "bfly" else lane + b if mode == "down" else b
            valid = source < 32
            regs[dst] = offers[source if valid else lane][1]
            if predicate:
                regs[predicate] = valid

    def run_block(self, block: int):
        self.shared = np.full(self.shared_bytes, 0xFF, dtype=np.uint8)  # (not zeros: nothing relies on them)
        self.touched, self.epoch = {}, 0
        specials = {"%ntid.x": self.threads, "%ntid.y": 1, "%ntid.z": 1, "%tid.y": 0, "%tid.z": 0,
                    "%ctaid.x": block, "%ctaid.y": 0, "%ctaid.z": 0, "%nctaid.x": self.blocks, "%nctaid.y": 1,
                    "%nctaid.z": 1}
        threads = [dict(specials, **{"%tid.x": t, "%laneid": t % 32, "%warpid": t // 32})
                   for t in range(self.threads)]
        pcs, stops = [0] * self.threads, [None] * self.threads
        steps = self.steps
        while True:
            for t, regs in enumerate(threads):
                if stops[t] is None:
                    pc = pcs[t]
                    while True:
                        nxt = steps[pc](regs)
                        if isinstance(nxt, str):
                            break
                        pc = nxt
                    pcs[t], stops[t] = pc, nxt  # at the statement it stopped at
            moved = False
            for w in range(0, self.threads, 32):
                if all(stops[t] == _SHUFFLE for t in range(w, w + 32)):
                    if len({pcs[t] for t in range(w, w + 32)}) > 1:
                        raise NotImplementedError(f"warp {w // 32}'s lanes at different shuffles")
                    self._exchange(threads[w:w + 32])
                    for t in range(w, w + 32):
                        pcs[t], stops[t] = pcs[t] + 1, None
                    moved = True
            if moved:
                continue
            live = [t for t in range(self.threads) if stops[t] != _EXIT]
            if not live:
                return
            if any(stops[t] != _BARRIER for t in live) or len({pcs[t] for t in live}) > 1:
                raise NotImplementedError("threads wait at different barriers or shuffles (or a warp's "
                                          "shuffle misses lanes)")
            for t in live:  # every live thread is at the block's barrier: all pass it
                pcs[t], stops[t] = pcs[t] + 1, None
            self.epoch += 1
