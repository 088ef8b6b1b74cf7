"""Published peak figures of common accelerators, for model FLOPs utilisation (MFU) and memory
planning: dense bf16/fp16 tensor-core peak FLOP/s (no sparsity) and memory per device, looked up
by `jax.Device.device_kind`.

Pure Python (no jax). A kind this table does not know, CPUs included, gives None: never a guess.
Figures are per jax device; on the TPUs listed here one device is one chip.

Memory is the vendor's nominal capacity, its "GB" read as GiB (HBM and GDDR capacities are
binary; an "80GB" A100 has exactly 80 GiB). What a runtime can allocate is somewhat less (jax's
`memory_stats()["bytes_limit"]`). When an NVIDIA kind names its size ("A100-SXM4-40GB"), that
size is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class _Accelerator:
    pattern: str  # searched case-insensitively in the device kind; first matching row wins
    flops: float | None  # dense bf16 (V100: fp16) tensor-core peak FLOP/s per device
    memory_gib: int | None


# Most specific first: "H100 PCIe" and "H100 NVL" before "H100", "A10G" before "A10"; "\b"
# keeps "A10" off "A100", "L4" off "L40S" and "H200" off "GH200" (whose named 480GB is mostly
# CPU memory). NVIDIA datasheets quote sparse throughput; the dense peak is half of it.
_TABLE = (
    # NVIDIA H100 datasheet: PCIe bf16 1,513 TFLOPS with sparsity, 80 GB HBM2e.
    _Accelerator(r"\bH100.*PCIe", 756e12, 80),
    # H100 NVL: 94 GB; its bf16 figure differs between datasheet revisions (per card vs per
    # NVLink pair), so none is given. Listed so that the SXM row below does not claim it.
    _Accelerator(r"\bH100.*NVL", None, 94),
    # NVIDIA H100 datasheet: SXM5 bf16 1,979 TFLOPS with sparsity (132 SMs x 1,830 MHz x 4,096
    # dense FLOP/clock = 989.4e12), 80 GB HBM3. jax reports it as "NVIDIA H100 80GB HBM3".
    _Accelerator(r"\bH100", 989.4e12, 80),
    # H200 NVL: same caveat as H100 NVL; NVIDIA H200 datasheet: 141 GB HBM3e.
    _Accelerator(r"\bH200.*NVL", None, 141),
    # NVIDIA H200 datasheet: SXM bf16 1,979 TFLOPS with sparsity (the H100 SXM compute), 141 GB.
    _Accelerator(r"\bH200", 989.4e12, 141),
    # NVIDIA A100 datasheet: bf16 312 TFLOPS dense (624 sparse), SXM4 and PCIe alike; 40 or
    # 80 GB, which the kind names ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe").
    _Accelerator(r"A100", 312e12, None),
    # A10G is an AWS-only part (EC2 G5): 24 GB per AWS; NVIDIA publishes no tensor figure for it
    # and it is not clocked like the A10, so none is given.
    _Accelerator(r"A10G", None, 24),
    # NVIDIA A10 datasheet: bf16 125 TFLOPS dense (250 sparse), 24 GB GDDR6.
    _Accelerator(r"\bA10\b", 125e12, 24),
    # NVIDIA L4 datasheet: bf16 242 TFLOPS with sparsity, 24 GB GDDR6.
    _Accelerator(r"\bL4\b", 121e12, 24),
    # NVIDIA V100 datasheet (no bf16 on Volta; fp16 tensor): V100S PCIe 130 TFLOPS, 32 GB.
    _Accelerator(r"V100S", 130e12, 32),
    # NVIDIA V100 datasheet: SXM2 125, PCIe 112 TFLOPS fp16 tensor; 16 or 32 GB, named in the
    # kind ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB").
    _Accelerator(r"V100.*SXM2", 125e12, None),
    _Accelerator(r"V100.*PCIE", 112e12, None),
    # Google Cloud TPU system-architecture pages, bf16 per chip (one jax device per chip; jax's
    # kinds are "TPU v4", "TPU v5 lite", "TPU v5", "TPU v6 lite"); HBM per chip as in the same
    # pages and XLA's own per-kind memory table. Anchored: "TPU v4 lite" (v4i) is another chip.
    _Accelerator(r"^TPU v4$", 275e12, 32),
    _Accelerator(r"^TPU v5 ?(lite|e)$", 197e12, 16),
    _Accelerator(r"^TPU v5p?$", 459e12, 95),
    _Accelerator(r"^TPU v6 ?(lite|e)$", 918e12, 32),
)

_NAMED_SIZE = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)


def _lookup(device_kind: str) -> _Accelerator | None:
    """The first table row whose pattern occurs in `device_kind`, or None."""
    kind = device_kind.strip()
    for row in _TABLE:
        if re.search(row.pattern, kind, re.IGNORECASE):
            return row
    return None


def peak_flops(device_kind: str) -> float | None:
    """Dense bf16 (V100: fp16) tensor-core peak FLOP/s of one device of `device_kind`, or None
    for CPUs and kinds not in the table."""
    row = _lookup(device_kind)
    return row.flops if row else None


def device_memory_bytes(device_kind: str) -> int | None:
    """Nominal memory of one device of `device_kind` in bytes (the size the kind names, else the
    table's), or None for CPUs and kinds not in the table."""
    row = _lookup(device_kind)
    if row is None:
        return None
    named = _NAMED_SIZE.search(device_kind) if not device_kind.startswith("TPU") else None
    gib = int(named.group(1)) if named else row.memory_gib
    return gib * GiB if gib is not None else None


def mfu(flops_per_s: float | None, device_count: int, peak_per_device: float | None) -> float | None:
    """Model FLOPs utilisation: achieved global FLOP/s over the peak of `device_count` devices.
    None when either figure is unknown (or the peak is not positive)."""
    if device_count < 1:
        raise ValueError(f"device_count must be at least 1, got {device_count}")
    if flops_per_s is None or peak_per_device is None or peak_per_device <= 0:
        return None
    return flops_per_s / (device_count * peak_per_device)
