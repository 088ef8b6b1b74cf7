"""scripts/bench_qlora.py: how it splits a plan's bytes per device (the runs themselves take minutes:
the script is run by hand, docs/benchmarks.md)."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_qlora.py"


def load_script():
    if str(SCRIPT.parent) not in sys.path:  # the script imports scripts/benchlib.py
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("bench_qlora", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def variable(path: str, dtype: str, bytes_per_device: int, trainable: bool = False, role=None) -> dict:
    """A variable as plan.json lists it (`role`: its role in a quantized layer, where it has one)."""
    found = {"path": path, "dtype": dtype, "bytes_per_device": bytes_per_device, "trainable": trainable}
    return {**found, "quantized": role} if role else found


def test_a_quantized_layers_variables_count_as_frozen_quantized_and_the_rest_by_whether_they_train():
    plan = {
        "variables": [
            variable("token_embedding/embeddings", "float32", 1000),
            variable("block_0/norm/scale", "float32", 10),
            variable("block_0/query/kernel", "int8", 200, role="kernel"),
            variable("block_0/query/kernel_scale", "float32", 30, role="scale"),
            variable("block_0/query/kernel_zero", "int8", 20, role="zero"),
            variable("block_0/query/g_idx", "float32", 4, role="index"),
            variable("block_0/query/lora_kernel_a", "float32", 7, trainable=True),
            variable("block_0/query/lora_kernel_b", "float32", 5, trainable=True),
            variable("block_0/gate/kernel", "float32", 400),  # a float layer beside them
        ],
        "per_device": {"params_bytes": 1676, "optimizer_bytes": 24, "total_bytes": 1700},
    }
    assert load_script().bytes_split(plan) == {
        "frozen_quantized_bytes": 254,
        "frozen_float_bytes": 1410,
        "trainable_bytes": 12,
        "optimizer_bytes": 24,
        "planned_total_bytes": 1700,
    }
