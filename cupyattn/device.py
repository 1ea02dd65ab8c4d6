"""Device limits: read from the live GPU, or taken from a table of named GPUs.

Planning is a pure function of (problem, DeviceSpec), so every GPU in the table
below can be planned for, explained and compile-checked on a machine with no GPU.
"""

from __future__ import annotations

import dataclasses
import os
import re

KIB = 1024


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """The limits that decide which kernel configurations fit a device.

    smem_per_block_optin is what one block may use after opting in with
    ``max_dynamic_shared_size_bytes`` (static + dynamic); smem_reserved_per_block
    is what the driver keeps per resident block on top of that, which matters
    for how many blocks share one SM.
    """

    name: str
    compute_capability: tuple[int, int]
    smem_per_block: int  # default limit without opting in (48 KiB everywhere)
    smem_per_block_optin: int
    smem_per_sm: int
    smem_reserved_per_block: int
    registers_per_sm: int
    max_registers_per_thread: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    sm_count: int
    device_id: int | None = None  # set for the live device only

    @property
    def arch(self) -> str:
        """NVRTC architecture name, e.g. ``sm_90``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def with_smem_limit(self, limit: int | None) -> DeviceSpec:
        """The same device planned as if a block could use at most ``limit`` bytes."""
        if limit is None:
            return self
        limit = int(limit)
        if limit <= 0:
            raise ValueError(f"smem_limit: expected a positive number of bytes, got {limit}")
        if limit >= self.smem_per_block_optin:
            return self
        return dataclasses.replace(
            self,
            name=f"{self.name} (smem_limit={limit})",
            smem_per_block_optin=limit,
            smem_per_block=min(self.smem_per_block, limit),
            # Planning "as if" a smaller GPU: the per-SM pool shrinks with the block limit.
            smem_per_sm=min(self.smem_per_sm, limit + self.smem_reserved_per_block),
        )

    def summary(self) -> str:
        return (
            f"{self.name} ({self.arch}, {self.sm_count} SMs): shared memory per block "
            f"{self.smem_per_block} default / {self.smem_per_block_optin} opt-in, "
            f"{self.smem_per_sm} per SM, {self.smem_reserved_per_block} reserved per block; "
            f"{self.registers_per_sm} registers per SM"
        )


def _spec(name, cc, optin, per_sm, sms, threads, blocks, reserved=1024):
    return DeviceSpec(
        name=name,
        compute_capability=cc,
        smem_per_block=48 * KIB,
        smem_per_block_optin=optin,
        smem_per_sm=per_sm,
        smem_reserved_per_block=reserved,
        registers_per_sm=65536,
        max_registers_per_thread=255,
        max_threads_per_sm=threads,
        max_blocks_per_sm=blocks,
        sm_count=sms,
    )


# Numbers from the CUDA C++ Programming Guide's per-architecture tables and the
# devices' own cudaDeviceGetAttribute answers (opt-in = per-SM pool minus the
# 1 KiB the driver reserves per block on sm_80 and newer).
NAMED_DEVICES: dict[str, DeviceSpec] = {
    "v100": _spec("Tesla V100", (7, 0), 98304, 98304, 80, 2048, 32, reserved=0),
    "t4": _spec("Tesla T4", (7, 5), 65536, 65536, 40, 1024, 16, reserved=0),
    "a100": _spec("A100", (8, 0), 166912, 167936, 108, 2048, 32),
    "rtx3090": _spec("GeForce RTX 3090", (8, 6), 101376, 102400, 82, 1536, 16),
    "orin": _spec("Jetson AGX Orin", (8, 7), 166912, 167936, 16, 1536, 16),
    "rtx4090": _spec("GeForce RTX 4090", (8, 9), 101376, 102400, 128, 1536, 24),
    "l4": _spec("L4", (8, 9), 101376, 102400, 58, 1536, 24),
    "rtx6000ada": _spec("RTX 6000 Ada", (8, 9), 101376, 102400, 142, 1536, 24),
    "h100": _spec("H100 SXM", (9, 0), 232448, 233472, 132, 2048, 32),
    "h200": _spec("H200", (9, 0), 232448, 233472, 132, 2048, 32),
    "b200": _spec("B200", (10, 0), 232448, 233472, 148, 2048, 32),
    "rtx5090": _spec("GeForce RTX 5090", (12, 0), 101376, 102400, 170, 1536, 32),
}

# A representative GPU per architecture, so ``sm_89``-style names work too.
_BY_ARCH = {
    "sm_70": "v100",
    "sm_75": "t4",
    "sm_80": "a100",
    "sm_86": "rtx3090",
    "sm_87": "orin",
    "sm_89": "rtx6000ada",
    "sm_90": "h100",
    "sm_100": "b200",
    "sm_120": "rtx5090",
}


def named_device(name: str) -> DeviceSpec:
    """A DeviceSpec from the table, by name (``t4``, ``rtx6000ada``) or arch (``sm_89``)."""
    key = name.strip().lower().replace("-", "").replace(" ", "")
    key = _BY_ARCH.get(key, key)
    if key not in NAMED_DEVICES:
        known = ", ".join(list(NAMED_DEVICES) + list(_BY_ARCH))
        raise ValueError(f"device: unknown device name {name!r}; known names: {known}, current")
    return NAMED_DEVICES[key]


def current_device(device_id: int | None = None) -> DeviceSpec:
    """Limits of the live GPU (the current CuPy device unless ``device_id`` is given)."""
    import cupy

    dev = cupy.cuda.Device(device_id) if device_id is not None else cupy.cuda.Device()
    attrs = dev.attributes
    cc = dev.compute_capability  # e.g. "90"
    major, minor = int(cc[:-1]), int(cc[-1])
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return DeviceSpec(
        name=name,
        compute_capability=(major, minor),
        smem_per_block=attrs["MaxSharedMemoryPerBlock"],
        smem_per_block_optin=attrs["MaxSharedMemoryPerBlockOptin"],
        smem_per_sm=attrs["MaxSharedMemoryPerMultiprocessor"],
        smem_reserved_per_block=props.get("reservedSharedMemPerBlock", 1024 if major >= 8 else 0),
        registers_per_sm=attrs["MaxRegistersPerMultiprocessor"],
        max_registers_per_thread=255,
        max_threads_per_sm=attrs["MaxThreadsPerMultiProcessor"],
        max_blocks_per_sm=props.get("maxBlocksPerMultiProcessor", 16),
        sm_count=attrs["MultiProcessorCount"],
        device_id=dev.id,
    )


def resolve_device(device: str | DeviceSpec | None = None) -> DeviceSpec:
    """A DeviceSpec from a spec, a name, ``"current"`` or None (the current device)."""
    if isinstance(device, DeviceSpec):
        return device
    if device is None or device == "current":
        return current_device()
    return named_device(device)


def smem_limit_from_env() -> int | None:
    """``CUPYATTN_SMEM_LIMIT``: plan as if the device had this many bytes per block."""
    raw = os.environ.get("CUPYATTN_SMEM_LIMIT")
    if raw is None or raw.strip() == "":
        return None
    m = re.fullmatch(r"\s*(\d+)\s*([kK](?:i?[bB])?)?\s*", raw)
    if not m:
        raise ValueError(f"CUPYATTN_SMEM_LIMIT: expected a number of bytes such as 101376 or 99K, got {raw!r}")
    return int(m.group(1)) * (KIB if m.group(2) else 1)
