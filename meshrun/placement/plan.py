"""The placement plan: where every variable and optimizer slot of a model lives on the mesh and how
many bytes it puts on each device, worked out from shapes alone, before anything is allocated.

`make_plan` is plain arithmetic over an abstract model (meshrun.run.build.describe) and the layout
rules; `meshrun plan` prints it, and a training run checks its rules with it and writes it as
plan.json. Bytes per device are exact: a sharded dimension holds size / axis size elements on every
device (rules that do not divide are errors), a replicated one holds all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from meshrun.config.layout_schema import LARGE_REPLICATED_BYTES, AxisSpec, LayoutRule, MeshConfig
from meshrun.config.slices import across_processes, span_of, spans, with_dcn
from meshrun.errors import ConfigError, DoesNotFit
from meshrun.placement.layout import Bend, RuleCheck, TensorSpec, bend_notes, check_rules, is_lora_adapter
from meshrun.placement.stacking import PipelinePlan
from meshrun.placement.traffic import Activations, SlowTraffic, slow_traffic
from meshrun.specs.jsondata import OMIT_IF_NONE, to_json
from meshrun.specs.quantized import QuantizedOf
from meshrun.wording import format_bytes, format_shape

MAX_LISTED = 10


@dataclass(frozen=True)
class Placement:
    """One variable on the mesh: the rule that placed it (None: no rule, replicated) and where that
    rule came from (`origin`: rules, extra_rules or from_model), its PartitionSpec, its bytes in
    total and on each device, and whether it trains (a frozen one has no optimizer slots).
    `reference` names the model variable an optimizer slot mirrors; `quantized`, for a variable of
    a quantized layer (model.quantize), its role there (kernel, scale, zero, index); `packed`, for
    a kernel whose bytes each hold two smaller values, what they are ("int4": its shape is the
    packed one, half the float kernel's columns); `float_shape`, for a quantized kernel, the shape
    of the float kernel it stands for."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    rule: str | None
    spec: tuple[AxisSpec, ...]
    bytes: int
    bytes_per_device: int
    reference: str | None = field(default=None, metadata={OMIT_IF_NONE: True})
    origin: str | None = field(default=None, metadata={OMIT_IF_NONE: True})
    trainable: bool = True
    quantized: str | None = field(default=None, metadata={OMIT_IF_NONE: True})
    packed: str | None = field(default=None, metadata={OMIT_IF_NONE: True})
    float_shape: tuple[int, ...] | None = field(default=None, metadata={OMIT_IF_NONE: True})

    @property
    def params(self) -> int:
        """The float model's parameters it counts for: its elements; for a quantized kernel, its
        float kernel's; for a quantization's scale, zero point or row index, none (they are not
        parameters of the float model)."""
        if self.quantized is None:
            return math.prod(self.shape)
        return math.prod(self.float_shape) if self.float_shape is not None else 0

    @property
    def replicated(self) -> bool:
        """Whether every device holds all of it (no rule, or only axes of size 1)."""
        return self.bytes_per_device == self.bytes


@dataclass(frozen=True)
class DeviceMemory:
    """The memory of one device the plan must fit in, and where that figure came from
    (devices.memory_gib, or what the accelerator reports)."""

    bytes: int
    source: str


@dataclass(frozen=True)
class StepMemory:
    """What one train step needs on each device beyond the state it updates, from the real step
    compiled on abstract inputs (meshrun.run.step_memory): `step_bytes_per_device`, the step's own
    memory (activations, gradients, temporaries: XLA's temp bytes), and `step_peak_bytes_per_device`,
    everything live at once (arguments + outputs + temp - what outputs reuse of donated inputs).
    `method` says how the figures were found; `seconds`, what finding them took; `remat`, the
    train.remat policy of the step compiled."""

    step_bytes_per_device: int
    step_peak_bytes_per_device: int
    method: str
    seconds: float
    remat: str = "none"

    def to_dict(self) -> dict:
        return {
            "step_bytes_per_device": self.step_bytes_per_device,
            "step_peak_bytes_per_device": self.step_peak_bytes_per_device,
            "method": self.method,
            "remat": self.remat,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class Plan:
    """A model's placement on a mesh: variables, optimizer slots, output constraints, per-device
    totals, the lint: errors (the run would be rejected) and warnings, and the pipeline stages
    (None: none)."""

    model: str
    mesh: MeshConfig
    optimizer: str
    variables: tuple[Placement, ...]
    slots: tuple[Placement, ...]
    outputs: tuple[dict, ...]
    errors: tuple[ConfigError, ...]
    warnings: tuple[str, ...]
    processes: int = 1
    memory: DeviceMemory | None = None
    pipeline: PipelinePlan | None = None
    traffic: SlowTraffic | None = None  # over the slow network between processes; None: one process
    step: StepMemory | None = None  # the train step's own memory; None: not worked out (state only)

    @property
    def params_bytes_per_device(self) -> int:
        return sum(p.bytes_per_device for p in self.variables)

    @property
    def optimizer_bytes_per_device(self) -> int:
        return sum(p.bytes_per_device for p in self.slots)

    @property
    def total_bytes_per_device(self) -> int:
        """The state's bytes on each device: parameters and optimizer slots."""
        return self.params_bytes_per_device + self.optimizer_bytes_per_device

    @property
    def needed_bytes_per_device(self) -> int:
        """What a device must hold to train: the step's peak where it is known (the state, the
        batch and the step's own memory at once), else the state alone."""
        return self.step.step_peak_bytes_per_device if self.step else self.total_bytes_per_device

    @property
    def quantized(self) -> bool:
        """Whether the base is quantized (model.quantize): some variables belong to quantized layers."""
        return any(p.quantized for p in self.variables)

    @property
    def trainable_bytes_per_device(self) -> int:
        """The bytes per device of the variables that train (under LoRA: the adapters)."""
        return sum(p.bytes_per_device for p in self.variables if p.trainable)

    @property
    def frozen_quantized_bytes_per_device(self) -> int:
        """The bytes per device of the quantized layers' frozen variables (kernels, scales, zeros)."""
        return sum(p.bytes_per_device for p in self.variables if p.quantized and not p.trainable)

    @property
    def frozen_float_bytes_per_device(self) -> int:
        """The bytes per device of the other frozen variables (embeddings, norms: left in float)."""
        return sum(p.bytes_per_device for p in self.variables if not p.quantized and not p.trainable)

    def split_bytes_per_device(self) -> dict[str, int]:
        """The parameters' bytes per device split by what they are, as plan.json's per_device
        holds them: trainable, frozen quantized and frozen float (the three add up to params_bytes)."""
        return {
            "trainable_bytes": self.trainable_bytes_per_device,
            "frozen_quantized_bytes": self.frozen_quantized_bytes_per_device,
            "frozen_float_bytes": self.frozen_float_bytes_per_device,
        }

    @property
    def params(self) -> int:
        """The parameters of the model as a float model: a quantized base (model.quantize) counts
        each quantized kernel as its float kernel's elements and its scales, zero points and row
        indices not at all, so that it has the parameters of the float base it comes from
        (its bytes, params_bytes, are what it holds)."""
        return sum(p.params for p in self.variables)

    @property
    def params_bytes(self) -> int:
        """The bytes of all parameters, unsharded (the model's whole size)."""
        return sum(p.bytes for p in self.variables)

    @property
    def trainable_params(self) -> int:
        """The parameters that train (all of them but frozen ones, such as those LoRA leaves)."""
        return sum(p.params for p in self.variables if p.trainable)

    @property
    def adapters(self) -> tuple[Placement, ...]:
        """The variables of LoRA adapters (lora_kernel_a, lora_kernel_b)."""
        return tuple(p for p in self.variables if is_lora_adapter(p.path))

    def largest_replicated(self, count: int = 5) -> list[Placement]:
        """The largest variables every device holds whole, largest first."""
        replicated = [p for p in self.variables if p.replicated and p.shape]
        return sorted(replicated, key=lambda p: -p.bytes)[:count]

    def raise_first_error(self) -> None:
        """Raises the first lint error as a ConfigError (a run stops before training), pointing
        to `meshrun plan` when there are more."""
        if not self.errors:
            return
        first = self.errors[0]
        if len(self.errors) == 1:
            raise first
        more = len(self.errors) - 1
        message = str(first).removeprefix(f"{first.key}: ")
        raise ConfigError(
            first.key,
            f"{message}; {more} more layout problem{'s' if more > 1 else ''}: "
            "`meshrun plan` with the same overrides lists them all",
        )

    def to_dict(self) -> dict:
        """The plan as JSON-ready data (what `meshrun plan --json` prints and plan.json holds)."""
        return {
            "status": "error" if self.errors else "ok",
            "model": {
                "name": self.model,
                "params": self.params,
                "params_bytes": self.params_bytes,
                "trainable_params": self.trainable_params,
                "frozen_params": self.params - self.trainable_params,
            },
            "mesh": {
                **to_json(self.mesh),
                "dcn": [span.across_processes for span in spans(self.mesh)],
                "devices": self.mesh.size,
                "across_processes": list(across_processes(self.mesh)),
                "axes": [to_json(span) for span in spans(self.mesh)],
            },
            "optimizer": self.optimizer,
            "variables": [_placement_dict(p) for p in self.variables],
            "optimizer_variables": [_placement_dict(p, slot=True) for p in self.slots],
            "outputs": list(self.outputs),
            "per_device": {
                "params_bytes": self.params_bytes_per_device,
                "optimizer_bytes": self.optimizer_bytes_per_device,
                "total_bytes": self.total_bytes_per_device,
                # A quantized base (model.quantize): what the parameters' bytes are made of.
                **(self.split_bytes_per_device() if self.quantized else {}),
            },
            **({"step": self.step.to_dict()} if self.step else {}),
            "largest_replicated": [{"path": p.path, "bytes": p.bytes} for p in self.largest_replicated()],
            **({"lora_adapters": _adapters_dict(self.adapters)} if self.adapters else {}),
            **(
                {
                    "device_memory": {
                        **to_json(self.memory),
                        "fits": self.needed_bytes_per_device <= self.memory.bytes,
                        "counts": "the step's peak" if self.step else "parameters and optimizer state only",
                    }
                }
                if self.memory
                else {}
            ),
            "processes": process_layout(self.mesh, self.processes),
            **({"slow_network": self.traffic.to_dict()} if self.traffic else {}),
            **({"pipeline": self.pipeline.to_dict()} if self.pipeline else {}),
            "errors": [str(e) for e in self.errors],
            "warnings": list(self.warnings),
        }


def process_layout(mesh: MeshConfig, processes: int) -> dict:
    """How a job of `processes` processes holds the mesh (its dcn filled in: each process holds one
    contiguous slice, meshrun.config.slices): the axes whose steps go from one process to another
    (their collectives leave the process), and the global batch cut into `batch_shares` parts,
    one per slice of the batch axis."""
    batch = span_of(mesh, mesh.batch_axis)
    return {
        "count": processes,
        "devices_per_process": mesh.size // processes,
        "axes_across_processes": list(across_processes(mesh)),
        "batch_shares": batch.across_processes,
    }


def make_plan(
    model_name: str,
    mesh: MeshConfig,
    rules: tuple[LayoutRule, ...],
    abstract,
    optimizer: str,
    processes: int = 1,
    advice=None,
    memory: DeviceMemory | None = None,
    lint: tuple[ConfigError, ...] = (),
    pipeline: PipelinePlan | None = None,
    activations: Activations | None = None,
    bends: tuple[Bend, ...] = (),
) -> Plan:
    """Places the abstract model's variables and optimizer slots by `rules` on `mesh` (no -1 left),
    for a job of `processes` processes; with `memory`, a total per device beyond it is an error
    (DoesNotFit, after any layout error). `advice(variables, mesh)`, where given, adds warnings about
    the placement (layout=auto's, or the model's own about a layout map it is known to get wrong).
    `lint`: problems of the rules found before (a pipelined model's, checked against its separate
    blocks), listed first; `bends`: the dimensions lenient rules left whole, found before as well
    (meshrun.placement.layout.with_bends: `rules` hold their exact rules), each rule's said in one
    note; `pipeline`: the stages the plan records. In a job of several processes (`mesh.dcn`
    filled in), `activations` sizes the estimate of what a step sends between them. A variable a
    rule matches but does not fit is listed with that rule, as the lint names it."""
    check = check_rules(rules, mesh, list(abstract.tensors))
    bends = (*bends, *check.bends)
    variables = tuple(
        _place(t, check.assigned.get(t.path) or check.misfits.get(t.path), mesh) for t in abstract.variables
    )
    by_path = {p.path: p for p in variables}
    plan = Plan(
        model=model_name,
        mesh=mesh,
        optimizer=optimizer,
        variables=variables,
        slots=tuple(_place_slot(slot, by_path, check, mesh) for slot in abstract.slots),
        outputs=_outputs(abstract, check),
        errors=(*lint, *check.errors),
        warnings=(
            *bend_notes(bends, mesh),
            *_idle_axis_warnings(variables, mesh),
            *_replicated_warnings(variables, mesh, _bent_paths(bends, abstract.variables)),
            *_unmatched_warnings(check.unmatched_optional),
            *_adapter_rule_warnings(variables),
            *(advice(variables, mesh) if advice else ()),
        ),
        processes=processes,
        memory=memory,
        pipeline=pipeline,
    )
    if processes > 1 and mesh.dcn is not None:
        plan = _with_traffic(plan, activations)
    too_large = _beyond_memory(plan)
    return replace(plan, errors=(*plan.errors, too_large)) if too_large else plan


def _outputs(abstract, check: RuleCheck) -> tuple[dict, ...]:
    """The output constraints: each output tensor a rule places, with that rule and its spec."""
    return tuple(
        {
            "path": t.path,
            "shape": list(t.shape),
            "rule": check.assigned[t.path].pattern,
            "spec": list(check.assigned[t.path].axes),
        }
        for t in abstract.tensors
        if t.is_output and t.path in check.assigned
    )


def _with_traffic(plan: Plan, activations: Activations | None) -> Plan:
    """The plan of a job of several processes with the estimate of what a step sends between them,
    and a warning for each axis that splits variables across them."""
    traffic = slow_traffic(plan.variables, plan.mesh, activations or Activations(rows=0, itemsize=4))
    return replace(
        plan,
        traffic=traffic,
        warnings=(*plan.warnings, *_tensor_across_warnings(traffic, plan.mesh, plan.processes)),
    )


def with_step_memory(plan: Plan, step: StepMemory) -> Plan:
    """`plan` with the train step's own memory counted: its fit verdict (DoesNotFit among its
    errors) worked out again from the step's peak."""
    errors = tuple(e for e in plan.errors if not isinstance(e, DoesNotFit))
    counted = replace(plan, step=step, errors=errors)
    too_large = _beyond_memory(counted)
    return replace(counted, errors=(*errors, too_large)) if too_large else counted


def _beyond_memory(plan: Plan) -> DoesNotFit | None:
    """DoesNotFit when what a device must hold to train (the step's peak where known, else the
    parameters and optimizer state) exceeds one device's memory."""
    if plan.memory is None or plan.needed_bytes_per_device <= plan.memory.bytes:
        return None
    needed, available = plan.needed_bytes_per_device, plan.memory.bytes
    state = (
        f"{format_bytes(plan.params_bytes_per_device)} parameters + "
        f"{format_bytes(plan.optimizer_bytes_per_device)} {plan.optimizer} state"
    )
    made_of, remedy = state, "shard more (layout=auto, layout.fsdp=true, a larger mesh)"
    if plan.step is not None:
        own = format_bytes(plan.step.step_bytes_per_device)
        made_of = f"the train step's peak: {state} + {own} of its own"
        if plan.step.step_bytes_per_device > plan.total_bytes_per_device:  # the step's own dominates
            recompute = "recompute activations (train.remat=blocks), " if plan.step.remat == "none" else ""
            remedy = (
                "a smaller train.batch_size or model.seq_len (meshrun plan --fit batch or --fit seq_len "
                f"finds the largest that fits), {recompute}or shard more"
            )
    return DoesNotFit(
        "devices.memory_gib",
        f"does not fit: the plan puts {format_bytes(needed)} on each device of mesh "
        f"{format_shape(plan.mesh.shape)} ({made_of}), {format_bytes(needed - available)} more than "
        f"the {format_bytes(available)} of one device ({plan.memory.source}); {remedy}, "
        "or give the real memory",
        needed=needed,
        available=available,
    )


def _place(tensor: TensorSpec, rule: LayoutRule | None, mesh: MeshConfig, reference=None) -> Placement:
    spec = rule.axes if rule else (None,) * len(tensor.shape)
    per_device = tensor.itemsize
    for size, axis in zip(
        tensor.shape, (*spec, *(None,) * len(tensor.shape)), strict=False
    ):  # a misfit's rank may differ
        per_device *= -(-size // mesh.axis_size(axis)) if axis else size
    return Placement(
        path=tensor.path,
        shape=tuple(tensor.shape),
        dtype=tensor.dtype,
        rule=(rule.derived_from or rule.pattern)
        if rule
        else None,  # an exact rule meshrun derived: the rule written
        spec=tuple(spec),
        bytes=math.prod(tensor.shape) * tensor.itemsize,
        bytes_per_device=per_device,
        reference=reference,
        origin=rule.origin if rule else None,
        trainable=tensor.trainable,
        **_quantized_fields(tensor.quantized),
    )


def _quantized_fields(quantized: QuantizedOf | None) -> dict:
    """What a Placement says of a variable of a quantized layer: its role, what a packed kernel
    holds (int4) and a kernel's float shape; nothing for any other variable."""
    if quantized is None:
        return {}
    return {
        "quantized": quantized.role,
        "packed": quantized.packs,
        "float_shape": tuple(quantized.float_shape) if quantized.role == "kernel" else None,
    }


def _place_slot(slot, variables: dict[str, Placement], check: RuleCheck, mesh: MeshConfig) -> Placement:
    """An optimizer slot takes the layout of the variable it mirrors (Keras passes the variable's
    layout on); the optimizer's own variables are looked up by path like any variable."""
    if slot.reference in variables:
        mirrored = variables[slot.reference]
        rule = LayoutRule(mirrored.rule, mirrored.spec, origin=mirrored.origin) if mirrored.rule else None
        return _place(slot.tensor, rule, mesh, reference=slot.reference)
    return _place(slot.tensor, check.assigned.get(slot.tensor.path), mesh)


def _tensor_across_warnings(traffic: SlowTraffic, mesh: MeshConfig, processes: int) -> list[str]:
    """A warning for each axis that splits variables across processes (tensor parallelism over the
    slow network), with its cost and a mesh.dcn that keeps it within processes where one exists."""
    if not traffic.tensor_axes:
        return []
    try:
        default = with_dcn(replace(mesh, dcn=None), processes)
    except ConfigError:
        default = None
    crossing = set(across_processes(default)) if default else set()
    fix = (
        f"keep it within a process: mesh.dcn=[{','.join(map(str, default.dcn))}]"
        if default and not crossing & set(traffic.tensor_axes)
        else "keep it within a process: give the batch axis at least "
        f"{processes} devices, or a smaller axis {traffic.tensor_axes[0]!r}"
    )
    return [
        f"mesh axis {axis!r} splits variables (tensor parallelism) across "
        f"{span_of(mesh, axis).across_processes} processes, over the slow network: "
        f"about {format_bytes(traffic.tensor_activations)} of activations a step from each process; {fix}"
        for axis in traffic.tensor_axes
    ]


def _idle_axis_warnings(variables, mesh: MeshConfig) -> list[str]:
    """Mesh axes besides the batch axis that shard no variable: their devices all do the same work."""
    used = {axis for p in variables for axis in p.spec if axis}
    return [
        f"mesh axis {axis!r} (size {mesh.axis_size(axis)}) shards no variable, so every step is computed "
        f"{mesh.axis_size(axis)} times over; pick a layout that uses it (layout=...) or give it size 1"
        for axis in mesh.axis_names
        if axis != mesh.batch_axis and axis not in used and mesh.axis_size(axis) > 1
    ]


def _bent_paths(bends: tuple[Bend, ...], variables) -> set[str]:
    """The variables a lenient rule left (partly) whole: bent paths, and stacked variables of
    pipelined blocks whose blocks' paths were bent."""
    bent = {bend.path for bend in bends}
    return bent | {v.path for v in variables if bent.intersection(v.blocks)}


def _replicated_warnings(variables, mesh: MeshConfig, said: set[str] = frozenset()) -> list[str]:
    """A warning for each large variable every device holds whole (the largest ten, then a count),
    but those a note has already explained (`said`)."""
    if (mesh.size or 1) <= 1:
        return []
    large = sorted(
        (p for p in variables if p.replicated and p.bytes >= LARGE_REPLICATED_BYTES and p.path not in said),
        key=lambda p: -p.bytes,
    )
    warnings = [
        f"{p.path} ({format_shape(p.shape)}, {format_bytes(p.bytes)}) is replicated: every one of the "
        f"{mesh.size} devices holds all of it"
        for p in large[:MAX_LISTED]
    ]
    if len(large) > MAX_LISTED:
        rest = large[MAX_LISTED:]
        warnings.append(
            f"... and {len(rest)} more replicated variables of at least "
            f"{format_bytes(LARGE_REPLICATED_BYTES)} "
            f"({format_bytes(sum(p.bytes for p in rest))} on every device)"
        )
    return warnings


def _unmatched_warnings(rules) -> list[str]:
    """The model's own rules that match none of its variables (KerasHub writes one map for a family)."""
    return [
        f"the model's own rule {rule.pattern!r} matches no variable of this model"
        for rule in rules
        if rule.origin == "from_model"
    ]


def _adapter_rule_warnings(variables) -> list[str]:
    """A warning for each rule that places LoRA adapters (meant for the kernels beside them, most
    likely): adapters are small and are best replicated."""
    placed: dict[tuple, list[Placement]] = {}
    for p in variables:
        if p.rule and is_lora_adapter(p.path):
            placed.setdefault((p.rule, p.origin), []).append(p)
    warnings = []
    for (rule, origin), adapters in placed.items():
        more = f" and {len(adapters) - 1} more adapter variables" if len(adapters) > 1 else ""
        warnings.append(
            f"rule '{rule}' ({origin}) also places the LoRA adapter {adapters[0].path}{more}: adapters are "
            "small and train best replicated; if the rule is meant for "
            "the kernels, end it in /kernel so that it leaves them out"
        )
    return warnings


def _adapters_dict(adapters: tuple[Placement, ...]) -> dict:
    """The LoRA adapters in a few figures: how many variables, their parameters and bytes per
    device, and how many of them a rule places (the rest are replicated)."""
    return {
        "variables": len(adapters),
        "params": sum(math.prod(p.shape) for p in adapters),
        "bytes_per_device": sum(p.bytes_per_device for p in adapters),
        "placed_by_rules": sum(1 for p in adapters if p.rule),
    }


def _placement_dict(p: Placement, slot: bool = False) -> dict:
    """A variable or optimizer slot as plan.json lists it, reference and origin only where known."""
    data = to_json(p)
    if slot:
        del data["trainable"]  # slots are the optimizer's; whether they train says nothing
    return data
