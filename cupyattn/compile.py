"""The only module that touches NVRTC / RawModule.

``get_kernel(config, device)`` compiles a configuration for the live device with
CuPy's ``RawModule`` (name expressions, C++17), caches it per (device, config,
hash of every file in kernels/), and opts the kernel into exactly the shared
memory its layout needs. The layout check (``check_expression``) is compiled in
the same module, so a kernel whose offsets disagree with the planner's never loads.

``compile_only(config, arch)`` compiles through NVRTC's bindings with no GPU and
reports registers, spills and static shared memory from the ptxas log.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import threading
from pathlib import Path

from .plan import check_expression

NVRTC_OPTIONS = ("-std=c++17",)


def kernels_dir() -> Path:
    """kernels/ of a checkout, or cupyattn/kernels of an installed package."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"cupyattn kernels not found next to {here}")


@functools.lru_cache(maxsize=1)
def kernels_hash() -> str:
    """Hash of every kernel file: CuPy's disk cache does not see included headers."""
    h = hashlib.sha256()
    for path in sorted(kernels_dir().glob("*.cu*")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def hashed_source(code: str) -> str:
    """``code`` (which includes kernels/ headers) after a line with the kernels' hash: CuPy's
    disk cache keys on the source text alone, so the key changes whenever any header does."""
    return f"// cupyattn kernels {kernels_hash()}\n{code}"


def kernel_source(config) -> str:
    return hashed_source(f'#include "{config.HEADER}"\n')


class CompileError(RuntimeError):
    pass


def _name_expressions(config) -> list[str]:
    """The kernel, and the layout check that must compile beside it (if it has a layout)."""
    check = check_expression(config)
    return [config.name_expression] + ([check] if check else [])


_cache: dict = {}
_lock = threading.Lock()


def target_arch(config, arch: str) -> str:
    """The architecture ``config`` compiles for on ``arch``: its own suffix added (wgmma
    kernels need sm_90a, the architecture-specific target of sm_90)."""
    suffix = getattr(config, "ARCH_SUFFIX", "")
    return arch if not suffix or arch.endswith(suffix) else arch + suffix


def get_kernel(config, device):
    """The loaded kernel (a ``cupy.RawKernel``) for ``config`` on the live ``device``."""
    import cupy

    key = (device.device_id, config.name_expression, kernels_hash())
    kernel = _cache.get(key)
    if kernel is not None:
        return kernel
    with _lock:  # first callers of one config compile it once
        kernel = _cache.get(key)
        if kernel is not None:
            return kernel
        with cupy.cuda.Device(device.device_id):
            if getattr(config, "ARCH_SUFFIX", ""):
                kernel = _load_arch_specific(config, device)
            else:
                try:
                    module = cupy.RawModule(
                        code=kernel_source(config),
                        options=NVRTC_OPTIONS + (f"-I{kernels_dir()}",),
                        name_expressions=_name_expressions(config),
                    )
                    kernel = module.get_function(config.name_expression)
                except cupy.cuda.compiler.CompileException as exc:
                    raise CompileError(f"compiling {config.name_expression} failed:\n{exc}") from exc
            smem = config.layout.total
            if smem > device.smem_per_block:
                kernel.max_dynamic_shared_size_bytes = smem
        _cache[key] = kernel
        return kernel


def _load_arch_specific(config, device):
    """A kernel for an architecture-specific target (sm_90a): CuPy's RawModule passes its
    own -arch, so NVRTC is called directly and the CUBIN loaded from a file, kept in
    CuPy's kernel cache directory (CUPY_CACHE_DIR) under a name that hashes the kernel,
    every kernel file and the NVRTC version."""
    import cupy

    major, minor = device.compute_capability
    arch = target_arch(config, f"sm_{major}{minor}")
    nvrtc = _Nvrtc.for_arch(arch)
    ident = f"{config.name_expression}|{arch}|{kernels_hash()}|{nvrtc.version()}"
    cache_dir = Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")
    path = cache_dir / f"cupyattn_{hashlib.sha256(ident.encode()).hexdigest()[:32]}.cubin"
    names = path.with_suffix(".name")
    if not (path.is_file() and names.is_file()):
        report = compile_only(config, arch)
        cache_dir.mkdir(parents=True, exist_ok=True)
        for target, data in ((path, report.cubin), (names, report.mangled_name.encode())):
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)  # atomic: a concurrent reader sees all or nothing
    return cupy.RawModule(path=str(path)).get_function(names.read_text())


@dataclasses.dataclass(frozen=True)
class CompileReport:
    name_expression: str
    arch: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    static_smem_bytes: int
    log: str = dataclasses.field(repr=False)
    cubin: bytes = dataclasses.field(default=b"", repr=False)
    mangled_name: str = ""

    @property
    def spills(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


def cuda_include_dirs() -> list[str]:
    """Where cuda_fp16.h / cuda_bf16.h live: pip's CUDA headers, CUDA_PATH, /usr/local/cuda."""
    dirs = []
    try:
        import cupy.cuda

        root = cupy.cuda.get_cuda_path()
        if root:
            dirs.append(os.path.join(root, "include"))
    except Exception:
        pass
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "include"))
    dirs.append("/usr/local/cuda/include")
    return [d for d in dirs if os.path.isfile(os.path.join(d, "cuda_fp16.h"))]


def _parse_ptxas(log: str, mangled: str) -> dict:
    """Registers, spills, stack and static smem of one entry function in a -Xptxas=-v log."""
    out = dict(registers=0, spill_store_bytes=0, spill_load_bytes=0, stack_bytes=0, static_smem_bytes=0)
    start = log.find(f"Function properties for {mangled}")
    if start < 0:
        raise CompileError(f"ptxas log has no entry for {mangled}:\n{log}")
    section = log[start:].split("Function properties for", 2)[1]
    patterns = {
        "stack_bytes": r"(\d+) bytes stack frame",
        "spill_store_bytes": r"(\d+) bytes spill stores",
        "spill_load_bytes": r"(\d+) bytes spill loads",
        "registers": r"Used (\d+) registers",
        "static_smem_bytes": r"(\d+) bytes smem",
    }
    for key, pat in patterns.items():
        m = re.search(pat, section)
        if m:
            out[key] = int(m.group(1))
    return out


def compile_only(config, arch: str) -> CompileReport:
    """Compile ``config`` for ``arch`` (e.g. ``sm_90``; ``target_arch`` adds a kernel's
    suffix, sm_90a for wgmma) without a GPU; report resources.

    Results are reused within a process (keyed by the kernel, its layout check,
    the architecture and the kernels' hash)."""
    return _compile_only(config, target_arch(config, arch), tuple(_name_expressions(config)), kernels_hash())


def _options(nvrtc, arch: str) -> list[str]:
    """NVRTC's options for the kernels on ``arch``: the language, target and include dirs."""
    return list(NVRTC_OPTIONS) + [f"-arch={arch}", f"-I{kernels_dir()}"] + [f"-I{d}" for d in nvrtc.include_dirs]


def check_layouts(configs, arch: str = "sm_90") -> int:
    """Compile the layout checks (``check_expression``: the kernel's shared-memory layout
    against the planner's, as static_asserts in an empty kernel) of many configurations,
    one NVRTC program a kernel header, without their kernels: cheap enough for every
    listed tile at every head dim. Raises CompileError naming those that disagree;
    returns how many checks compiled."""
    by_header: dict = {}
    for config in configs:
        check = check_expression(config)
        if check:
            by_header.setdefault((config.HEADER, target_arch(config, arch)), {})[check] = config
    for (header, target), checks in sorted(by_header.items()):
        nvrtc = _Nvrtc.for_arch(target)
        options = _options(nvrtc, target)
        failed = _compile_checks(nvrtc, header, options, list(checks))
        if failed:
            bad = sorted(checks[k].name_expression for k in _failing_checks(nvrtc, header, options, list(checks)))
            exc, log = failed
            raise CompileError(f"layout check of {', '.join(bad)} ({header}, {target}) failed ({exc}):\n{log}")
    return sum(len(checks) for checks in by_header.values())


def _compile_checks(nvrtc, header: str, options: list, checks: list):
    """Compile ``checks`` (name expressions) in one program of ``header``: None, or the
    error and NVRTC's log."""
    prog = nvrtc.create_program(hashed_source(f'#include "{header}"\n'), "cupyattn_layouts.cu")
    try:
        for check in checks:
            nvrtc.add_name_expression(prog, check)
        try:
            nvrtc.compile_program(prog, options)
        except CompileError as exc:
            return exc, nvrtc.program_log(prog)
        return None
    finally:
        nvrtc.destroy_program(prog)


def _failing_checks(nvrtc, header: str, options: list, checks: list) -> list:
    """Which of ``checks`` (that fail together) fail alone, found by halves: the log
    prints each layout as the compiler spells it (default template arguments written
    out, expressions evaluated), not as the check names it."""
    if len(checks) == 1:
        return checks
    halves = (checks[: len(checks) // 2], checks[len(checks) // 2 :])
    return [
        check
        for half in halves
        if _compile_checks(nvrtc, header, options, half)
        for check in _failing_checks(nvrtc, header, options, half)
    ]


# NVRTC 13 (CUDA 13) dropped these; NVRTC 12 still compiles for them.
LEGACY_ARCHS = ("sm_70", "sm_72")


@functools.cache
def _compile_only(config, arch: str, _names: tuple, _kernels_hash: str) -> CompileReport:
    expr = config.name_expression
    nvrtc = _Nvrtc.for_arch(arch)
    options = _options(nvrtc, arch) + ["-Xptxas=-v"]
    prog = nvrtc.create_program(kernel_source(config), "cupyattn.cu")
    try:
        for name in _name_expressions(config):
            nvrtc.add_name_expression(prog, name)
        try:
            nvrtc.compile_program(prog, options)
        except CompileError as exc:
            raise CompileError(f"compiling {expr} for {arch} failed ({exc}):\n{nvrtc.program_log(prog)}") from exc
        log = nvrtc.program_log(prog)
        mangled = nvrtc.lowered_name(prog, expr)
        cubin = nvrtc.cubin(prog)
    finally:
        nvrtc.destroy_program(prog)
    return CompileReport(expr, arch, log=log, cubin=cubin, mangled_name=mangled, **_parse_ptxas(log, mangled))


class _Nvrtc:
    """The NVRTC calls compile_only needs, through ctypes: NVRTC 13 (the one CuPy
    loads) for current architectures; NVRTC 12 from pip (nvidia-cuda-nvrtc-cu12,
    with nvidia-cuda-runtime-cu12's headers) for sm_70 / sm_72, which NVRTC 13
    dropped. (CuPy's own bindings truncate getCUBIN's result, hence ctypes.)"""

    _loaded: dict = {}

    def __init__(self, lib_path: str, include_dirs: list[str]):
        import ctypes

        self._c = ctypes
        self.lib = ctypes.CDLL(lib_path)
        self.include_dirs = include_dirs
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    @classmethod
    def for_arch(cls, arch: str) -> _Nvrtc:
        legacy = arch in LEGACY_ARCHS
        if legacy not in cls._loaded:
            cls._loaded[legacy] = cls._load_legacy() if legacy else cls._load_current()
        return cls._loaded[legacy]

    @classmethod
    def _load_current(cls) -> _Nvrtc:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return cls(load_nvidia_dynamic_lib("nvrtc").abs_path, cuda_include_dirs())

    @classmethod
    def _load_legacy(cls) -> _Nvrtc:
        try:
            import nvidia.cuda_nvrtc
            import nvidia.cuda_runtime
        except ImportError as exc:
            raise CompileError(
                "compiling for sm_70/sm_72 needs NVRTC 12: pip install nvidia-cuda-nvrtc-cu12 "
                "nvidia-cuda-runtime-cu12 (NVRTC 13 no longer targets them)"
            ) from exc
        lib = os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib", "libnvrtc.so.12")
        inc = os.path.join(list(nvidia.cuda_runtime.__path__)[0], "include")
        return cls(lib, [inc])

    def _check(self, status: int):
        if status != 0:
            raise CompileError(f"{self.lib.nvrtcGetErrorString(status).decode()} ({status})")

    def create_program(self, src: str, name: str):
        prog = self._c.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(self._c.byref(prog), src.encode(), name.encode(), 0, None, None))
        return prog

    def add_name_expression(self, prog, expr: str):
        self._check(self.lib.nvrtcAddNameExpression(prog, expr.encode()))

    def compile_program(self, prog, options: list[str]):
        opts = (self._c.c_char_p * len(options))(*[o.encode() for o in options])
        self._check(self.lib.nvrtcCompileProgram(prog, len(options), opts))

    def _blob(self, prog, size_fn, get_fn) -> bytes:
        size = self._c.c_size_t()
        self._check(size_fn(prog, self._c.byref(size)))
        buf = self._c.create_string_buffer(size.value)
        self._check(get_fn(prog, buf))
        return buf.raw[: size.value]

    def program_log(self, prog) -> str:
        raw = self._blob(prog, self.lib.nvrtcGetProgramLogSize, self.lib.nvrtcGetProgramLog)
        return raw.rstrip(b"\0").decode(errors="replace")

    def cubin(self, prog) -> bytes:
        return self._blob(prog, self.lib.nvrtcGetCUBINSize, self.lib.nvrtcGetCUBIN)

    def ptx(self, prog) -> str:
        return self._blob(prog, self.lib.nvrtcGetPTXSize, self.lib.nvrtcGetPTX).rstrip(b"\0").decode()

    def lowered_name(self, prog, expr: str) -> str:
        out = self._c.c_char_p()
        self._check(self.lib.nvrtcGetLoweredName(prog, expr.encode(), self._c.byref(out)))
        return out.value.decode()

    def version(self) -> str:
        major, minor = self._c.c_int(), self._c.c_int()
        self._check(self.lib.nvrtcVersion(self._c.byref(major), self._c.byref(minor)))
        return f"{major.value}.{minor.value}"

    def destroy_program(self, prog):
        self._check(self.lib.nvrtcDestroyProgram(self._c.byref(prog)))


def sass(report: CompileReport) -> str:
    """Disassembly of a compile_only result (cuobjdump from pip's or the system's CUDA)."""
    if not report.cubin:
        raise ValueError(f"no CUBIN kept for {report.name_expression} ({report.arch})")
    return disassemble(report.cubin)


def empty_wgmmas(sass_text: str) -> list[str]:
    """The HGMMAs of ``sass_text`` that ptxas left empty (``HGMMA.64x8x16.F16 RZ,
    gdesc[URZ], ...``): where it drops wgmmas it judged dead or the same as others, it
    keeps an empty one in each commit group's place. Only a miscompile drops ours (every
    product is used): "fp32" dQ at head dims up to 48 once used S as dP that way."""
    return [line.strip() for line in sass_text.splitlines() if "HGMMA" in line and "gdesc[URZ]" in line]


def disassemble(cubin: bytes) -> str:
    """SASS of a CUBIN (cuobjdump from pip's or the system's CUDA)."""
    import shutil
    import subprocess
    import tempfile

    candidates = [shutil.which("cuobjdump")]
    try:
        import cupy.cuda

        candidates.append(os.path.join(cupy.cuda.get_cuda_path() or "", "bin", "cuobjdump"))
    except Exception:
        pass
    tool = next((c for c in candidates if c and os.path.isfile(c)), None)
    # cuobjdump runs nvdisasm, which pip installs next to it.
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(tool or ""), os.environ.get("PATH", "")]))
    if tool is None or shutil.which("nvdisasm", path=env["PATH"]) is None:
        raise FileNotFoundError("cuobjdump / nvdisasm not found: pip install 'cuda-toolkit[cuobjdump,nvdisasm]'")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True, env=env).stdout
