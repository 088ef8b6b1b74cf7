"""Picks the devices a run uses. `prepare` must run before jax is imported: the CPU device count is
fixed when jax first initialises its backends, for the life of the process."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from meshrun.compat.jax import JAX_PLATFORM_LOGGER
from meshrun.config.layout_schema import MeshConfig
from meshrun.config.schema import CacheConfig, DevicesConfig
from meshrun.config.slices import spans, with_dcn
from meshrun.errors import ConfigError
from meshrun.system.trust import private_dir
from meshrun.wording import first_line, format_shape

log = logging.getLogger("meshrun")

_JAX_PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}


@dataclass(frozen=True)
class DeviceSet:
    """The devices a run uses (the first `mesh.size` of the platform's), how they were found, and
    the mesh with any -1 dimension filled in for them."""

    mesh: MeshConfig
    platform: str
    kind: str
    devices: tuple
    available: int
    emulated: bool
    processes: int


def device_memory(config: DevicesConfig, found: DeviceSet | None = None):
    """The memory of one device that a plan must fit in: devices.memory_gib where given, else the
    smallest allocator limit the accelerators report (none on CPU); None when unknown."""
    from meshrun.placement.plan import DeviceMemory

    if config.memory_bytes is not None:
        return DeviceMemory(config.memory_bytes, f"devices.memory_gib={config.memory_gib:g}")
    if found is None or found.emulated:
        return None
    import jax

    local = [d for d in found.devices if d.process_index == jax.process_index()]
    limits = [
        stats["bytes_limit"]
        for stats in (d.memory_stats() for d in local)
        if stats and "bytes_limit" in stats
    ]
    return DeviceMemory(min(limits), f"what the {found.kind} reports") if limits else None


def cpu_devices_needed(mesh: MeshConfig, devices: DevicesConfig) -> int:
    """How many CPU devices the job emulates: the mesh's size, or devices.cpu_devices for a -1
    shape (split evenly over the job's processes)."""
    return mesh.size or devices.cpu_devices


def prepare(devices: DevicesConfig, mesh: MeshConfig, processes: int = 1) -> None:
    """Sets the environment jax and keras read at import: the jax backend for Keras, the platform,
    and the number of emulated CPU devices (this process's share of the job's). Harmless when jax
    is already imported (then the device count is whatever that process has, which `discover`
    checks)."""
    os.environ["KERAS_BACKEND"] = "jax"
    # tf.data is all meshrun uses of TensorFlow, when a source needs it: keep its C++ start-up
    # chatter off the console, and keep it from reserving GPU memory should the user's code import
    # a GPU build of it before meshrun hides its GPUs (import_tensorflow).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    # With platform=auto jax probes for TPUs and GPUs and logs each miss at INFO.
    logging.getLogger(JAX_PLATFORM_LOGGER).setLevel(logging.WARNING)
    if devices.platform != "auto":
        os.environ["JAX_PLATFORMS"] = _JAX_PLATFORMS[devices.platform]
    if "jax" not in sys.modules:
        os.environ["JAX_NUM_CPU_DEVICES"] = str(cpu_devices_needed(mesh, devices) // processes)


def compilation_cache_dir(cache: CacheConfig) -> str | None:
    """Where XLA's persistent compilation cache lives, or None when it is off."""
    if not cache.enabled:
        return None
    if cache.dir:
        return os.path.abspath(os.path.expanduser(cache.dir))
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "meshrun", "xla")


def set_compilation_cache(cache: CacheConfig) -> str | None:
    """Turns XLA's persistent compilation cache on (every compiled program, however quick to
    compile, so a repeated run skips most compilation) or off; returns its dir. jax honours this
    until its first compilation, so call it before anything compiles (later jobs of one process
    keep the first job's cache)."""
    import jax

    cache_dir = compilation_cache_dir(cache)
    if cache_dir is not None:  # it holds code jax will run: only a directory no one else can write to
        private_dir(cache_dir, "cache.dir", cache.shared, what="XLA's compiled code")
    jax.config.update("jax_enable_compilation_cache", cache.enabled)
    if cache_dir is not None:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return cache_dir


def prepare_for_plan(devices: DevicesConfig, mesh: MeshConfig) -> None:
    """Sets up jax for `meshrun plan`, which needs devices only to fill in a -1 in the mesh and to
    compile the train step for its memory (only when there is a device memory to fit): with an
    explicit shape it plans for devices this machine need not have, on CPU devices it emulates
    (one, or one per mesh position to compile on); either way it never preallocates accelerator
    memory."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if mesh.size is None:
        prepare(devices, mesh)
        return
    emulated = mesh.size if devices.memory_bytes is not None else 1
    prepare(
        DevicesConfig(platform="cpu", cpu_devices=emulated),
        MeshConfig(shape=(emulated,), axis_names=("data",), batch_axis="data"),
    )


def cpu_devices_in_mesh_order(mesh: MeshConfig) -> tuple:
    """One CPU device of this process per position of `mesh` (no -1 left), in mesh order, to
    compile for it; empty when this process has fewer (the count is fixed when jax starts)."""
    import jax

    found = jax.devices("cpu")
    return tuple(found[: mesh.size]) if len(found) >= mesh.size else ()


def available_count(devices: DevicesConfig) -> int:
    """How many devices a run could use here: the accelerators jax finds, or devices.cpu_devices
    emulated CPU devices (a ConfigError when the platform asked for is missing)."""
    every = MeshConfig(shape=(-1,), axis_names=("data",), batch_axis="data")
    prepare(devices, every)
    return discover(devices, every).mesh.size


def discover(devices: DevicesConfig, mesh: MeshConfig, slow_first: tuple[str, ...] = ()) -> DeviceSet:
    """Imports jax and returns the devices for `mesh` in mesh order, or raises ConfigError when the
    platform is missing, the device count does not fit the mesh, or mesh.dcn does not fit the job's
    processes. Each process holds one slice of the mesh (meshrun.config.slices; `slow_first`: the
    axes the default dcn puts across processes first)."""
    import jax

    try:
        found = jax.devices()
    except (RuntimeError, AssertionError) as err:  # jax asserts when a platform plugin is missing
        reason = first_line(err) or "its jax plugin is not installed"
        raise ConfigError(
            "devices.platform",
            f"got {devices.platform!r} but jax cannot use that platform ({reason}); valid here: auto or cpu",
        ) from None
    platform = found[0].platform
    emulated = platform == "cpu"
    resolved = mesh.resolved(len(found))
    needed = resolved.size
    if emulated and needed > len(found):
        raise ConfigError(
            "mesh.shape",
            f"mesh {format_shape(resolved.shape)} needs {needed} devices but this process already "
            f"has {len(found)} CPU devices (fixed when jax started); run it in a new process",
        )
    if not emulated and needed != len(found):
        raise ConfigError(
            "mesh.shape",
            f"got {format_shape(resolved.shape)} ({needed} devices) but there are {len(found)} "
            f"{platform} devices; use a shape whose product is {len(found)}",
        )
    processes = jax.process_count()
    resolved = with_dcn(resolved, processes, slow_first, key="the processes that joined")
    return DeviceSet(
        mesh=resolved,
        platform=platform,
        kind=found[0].device_kind,
        devices=mesh_order(found[:needed], resolved, processes),
        available=len(found),
        emulated=emulated,
        processes=processes,
    )


def mesh_order(found: list, mesh: MeshConfig, processes: int) -> tuple:
    """`found` (jax's devices, numbered by process) in mesh order: with several processes, jax's
    create_hybrid_device_mesh makes each process's devices one contiguous slice of the mesh, laid
    out as mesh.dcn says; with one, jax's order as it is."""
    if processes == 1:
        return tuple(found)
    from jax.experimental import mesh_utils

    in_process = [span.in_process for span in spans(mesh)]
    ordered = mesh_utils.create_hybrid_device_mesh(in_process, list(mesh.dcn), found, process_is_granule=True)
    return tuple(ordered.flatten())
