"""glibc malloc's policy for large blocks, as meshrun sets it for training, and the process's minor
page faults, which show what the policy costs.

glibc serves a block above its mmap threshold with a fresh mmap and unmaps it when it is freed, and
gives the top of a heap back to the system once more than its trim threshold lies free there. Both
thresholds start low (128 KiB, 256 KiB) and rise with the largest mmapped block freed so far (up to
32 MiB), unless something fixes them with `mallopt`. Two things make a training step on the host
fault its buffers in afresh, step after step:

- The first GeneratorDataset TensorFlow constructs in a process (a tf.data pipeline over a generator)
  calls `mallopt(M_MMAP_THRESHOLD, 128 KiB)` (`ApplyPython311MemoryPatch` in its op's constructor).
  XLA's CPU runtime then maps its temporary buffer and larger activations every step: a KerasHub
  Llama of 2 layers went from 3.5 to 8.8 ms and from 1 to 3,000 minor faults a step.
- On a mesh of emulated CPU devices each of XLA's threads allocates from a heap of its own, which
  glibc trims whenever a step's buffers are freed and which the next step grows again: 70 to 500
  minor faults a step for the same Llama on 2x4 devices, however the data is fed.

`set_training_policy` fixes both thresholds where the dynamic policy would end up for a program that
frees large blocks all the time: blocks from 32 MiB are mmapped, a heap is trimmed once 128 MiB lie
free at its top; and it pads each heap's growth by 64 MiB (M_TOP_PAD), which also keeps a thread's
extra heap that has emptied instead of unmapping it (glibc unmaps an empty extra heap whatever the
trim threshold, and the next step maps and faults it in again). It holds until something calls
mallopt again (TensorFlow's generator dataset does, once per process: meshrun.run.feed sets it again
after the pipeline's first batch).

What stays: a step that cannot reuse a freed block grows the heap and faults the new pages in once
(the zoo transformer's 31 MiB logits gradient, say, when smaller blocks took part of its old place);
Python 3.11 maps a 16 KiB frame stack for every call into Python from a foreign thread (each element
of a generator dataset). No jax, keras or TensorFlow here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource

M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for the dynamic threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 128 << 20
TOP_PAD = 64 << 20


@functools.lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (the one whose thresholds these are), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        _ = libc.gnu_get_libc_version  # glibc's own: AttributeError on another libc
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return libc


def set_training_policy() -> bool:
    """Fixes glibc's mmap threshold at MMAP_THRESHOLD, its trim threshold at TRIM_THRESHOLD and its
    top pad at TOP_PAD, so the large blocks a training step frees stay in the heap for the next
    step. True when they were set; False where the C library is not glibc (its allocator is left as
    it is). It is the process's policy from then on, also when meshrun runs as a library."""
    libc = _glibc()
    if libc is None:
        return False
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))
    return all([bool(libc.mallopt(parameter, value)) for parameter, value in settings])


class _MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (malloc.h, glibc 2.33 and later)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def bytes_in_use() -> int | None:
    """The bytes malloc has handed out and not had back, over all of glibc's arenas and mmapped
    blocks (mallinfo2: uordblks + hblkhd); None where the C library is not glibc 2.33 or later.
    Unlike the resident size, it leaves out what the allocator keeps after a free and the pages
    of loaded libraries."""
    libc = _glibc()
    mallinfo2 = getattr(libc, "mallinfo2", None) if libc is not None else None
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    found = mallinfo2()
    return int(found.uordblks + found.hblkhd)


def minor_faults() -> int:
    """Minor page faults of this process (all its threads) so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
