"""logging.tensorboard: the step log as TensorBoard event files."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from meshrun.logs.sinks import SinkSpec, register_sink

TENSORBOARD_DIR = "tensorboard"


class TensorBoard:
    """Event files in <run dir>/tensorboard: per step `train/<metric>`, `train/learning_rate` and
    `train/samples_per_s`; per epoch `epoch/<metric>` (val_* included) at the epoch's number.

    An event file is a TFRecord file of `Event` protos, so TensorFlow's C++ record writer writes
    it: about 6 µs a step here, against 40 µs for TensorBoard's own writer (its checksums are pure
    Python and run on a thread that contends for the GIL) and 0.5 ms a scalar for tf.summary."""

    kind = "tensorboard"

    def __init__(self, run_dir: Path):
        import tensorflow as tf
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self.path = run_dir / TENSORBOARD_DIR  # a dir of event files
        self.path.mkdir(parents=True, exist_ok=True)
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}"
        self._writer = tf.io.TFRecordWriter(str(self.path / name))
        self._writer.write(self._event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())

    def _write(self, step: int, values: dict) -> None:
        summary = self._summary(value=[
            self._summary.Value(tag=tag, simple_value=value) for tag, value in values.items() if value is not None
        ])
        self._writer.write(self._event(step=step, wall_time=time.time(), summary=summary).SerializeToString())

    def step(self, record: dict) -> None:
        self._write(record["step"], {f"train/{k}": v for k, v in record.items() if k not in ("step", "epoch", "step_s")})

    def epoch(self, record: dict) -> None:
        self._write(record["epoch_end"], {f"epoch/{k}": v for k, v in record.items() if k not in ("epoch_end", "step")})
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


register_sink(SinkSpec("tensorboard", TensorBoard, "event files in <run dir>/tensorboard (tensorboard --logdir <run dir>/tensorboard)"))
