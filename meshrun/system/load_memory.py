"""What building a model and loading its weights costs in memory: the most bytes any one device
held at once and the most host memory the process took, each beyond what it held when loading began
(memory.load_peak_bytes_per_device and memory.load_peak_host_bytes in metrics.json). A device's
figure counts the arrays made since, so those a previous job in the same process left behind do not
count, whether or not they are freed meanwhile.

Both are sampled: on a thread of this module every few milliseconds, and wherever the loader calls
`sample()` (meshrun.compat.keras.sharded_loading.load_onto_shards does after placing each weight
read from a preset).
Device bytes are the shards of jax's live arrays. Host bytes are what malloc has handed out and not
had back (meshrun.system.allocator.bytes_in_use) less the bytes of the arrays held on CPU devices, whose
buffers XLA allocates there: on emulated CPU devices as on a GPU machine, the figure is the host's
own use (arrays read from files, staging copies, compilation), without the pages of libraries
imported meanwhile or what the allocator keeps after a free.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import weakref
from dataclasses import dataclass

import jax

from meshrun.system import allocator

SAMPLE_INTERVAL_S = 0.005


@dataclass(frozen=True)
class LoadPeaks:
    """The most bytes one device held while the model was built and loaded, and the most host
    memory the process took, each beyond what it held when loading began (host: None where the C
    library does not say: meshrun.system.allocator.bytes_in_use)."""

    bytes_per_device: int
    host_bytes: int | None


class LoadWatch:
    """Samples the bytes on `devices` and the host memory while in force (a context manager);
    `peaks()` gives the largest of each."""

    def __init__(self, devices, interval_s: float = SAMPLE_INTERVAL_S):
        self._devices = list(devices)
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._host_at_start: int | None = None
        self._before: dict[int, weakref.ref] = {}  # the arrays alive when loading began, by id
        self._device_peak = 0
        self._host_peak: int | None = None
        self._in_force: contextvars.Token | None = None

    def __enter__(self) -> LoadWatch:
        self._before = {id(array): weakref.ref(array) for array in jax.live_arrays()}
        self._host_at_start = self.sample()
        self._in_force = _WATCHING.set((*_WATCHING.get(), self))
        self._thread = threading.Thread(
            target=self._sample_until_stopped, name="meshrun-load-watch", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        _WATCHING.reset(self._in_force)
        self._stop.set()
        self._thread.join()
        self.sample()

    def peaks(self) -> LoadPeaks:
        host = (
            None
            if self._host_peak is None or self._host_at_start is None
            else max(0, self._host_peak - self._host_at_start)
        )
        return LoadPeaks(bytes_per_device=self._device_peak, host_bytes=host)

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def sample(self) -> int | None:
        """Takes one sample now; returns the host bytes in use (None where they cannot be read)."""
        with self._lock:
            live = jax.live_arrays()
            held = bytes_by_device(live)
            added = bytes_by_device([array for array in live if not self._held_before(array)])
            self._device_peak = max([self._device_peak, *(added.get(d, 0) for d in self._devices)])
            # Dropped before the lock is: a sample on another thread must not find a value the
            # loader has let go of still alive in this list beside the one that replaced it.
            del live
            in_use = allocator.bytes_in_use()
            if in_use is None:
                return None
            host = in_use - sum(count for device, count in held.items() if device.platform == "cpu")
            self._host_peak = host if self._host_peak is None else max(self._host_peak, host)
            return host

    def _held_before(self, array) -> bool:
        """Whether `array` was alive when loading began (not a new array at a freed one's id)."""
        before = self._before.get(id(array))
        return before is not None and before() is array


# The LoadWatches in force in this context, innermost last: a LoadWatch's with-block sets them and
# puts back those before on leaving (scoped, as meshrun.pipeline.blocks' stages are). Not passed as
# an argument: the run watches around the model spec's build hook (meshrun.run.execute.build),
# which takes no watch, and the loader samples from inside Keras' variable assignment
# (meshrun.compat.keras.load_onto_shards' patch), reached through KerasHub's from_preset.
_WATCHING: contextvars.ContextVar[tuple[LoadWatch, ...]] = contextvars.ContextVar(
    "meshrun_load_watches", default=()
)


def sample() -> None:
    """Takes a sample now for every LoadWatch in force (none: nothing to do)."""
    for watch in _WATCHING.get():
        watch.sample()


@contextlib.contextmanager
def unsampled():
    """No LoadWatch samples while in force: for a loader assembling a sharded array from arrays on
    single devices, which for a moment are alive beside it and share its buffers (a sample then
    would count those bytes twice)."""
    with contextlib.ExitStack() as held:
        for watch in _WATCHING.get():
            held.enter_context(watch._lock)
        yield


def bytes_by_device(arrays) -> dict:
    """The bytes of `arrays` (jax arrays) on each device of this process that holds any."""
    held: dict = {}
    for array in arrays:
        try:
            sharding = array.sharding
            shard_bytes = math.prod(sharding.shard_shape(array.shape)) * array.dtype.itemsize
            devices = sharding.addressable_devices
        except Exception:  # deleted while we looked, or a sharding without one shard shape
            continue
        for device in devices:
            held[device] = held.get(device, 0) + shard_bytes
    return held
