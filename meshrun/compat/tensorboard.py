"""TensorBoard, as meshrun uses it past its public API: the protos of its event files, from the
copies TensorBoard keeps for running without TensorFlow (the sink logging.tensorboard writes
them). Importing this module imports no TensorBoard."""

from __future__ import annotations

from meshrun.compat.names import PrivateName, ensure, uses

PRIVATE_NAMES = uses(
    "tensorboard",
    PrivateName(
        "tensorboard",
        "tensorboard.compat.proto.event_pb2",
        "Event",
        "the records of TensorBoard's event files, written without TensorFlow (logging.tensorboard)",
    ),
    PrivateName(
        "tensorboard",
        "tensorboard.compat.proto.summary_pb2",
        "Summary.Value",
        "the scalars in TensorBoard's event files, written without TensorFlow (logging.tensorboard)",
    ),
)


def event_protos() -> tuple[type, type]:
    """TensorBoard's Event and Summary proto classes, as its event files hold them."""
    ensure("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2

    return event_pb2.Event, summary_pb2.Summary
