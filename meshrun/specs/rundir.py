"""What a run dir holds, by name: the one place the files meshrun writes into a run dir (Hydra's job
output dir) are named, for the run that writes them and for everyone that reads them (reports and
sweeps, the launchers, resume, `meshrun generate`)."""

from __future__ import annotations

from pathlib import Path

METRICS_FILE = "metrics.json"  # the run's results (meshrun.specs.metrics.RunMetrics)
PLAN_FILE = "plan.json"  # the plan the run was checked against (meshrun.placement.plan)
LOG_FILE = "log.jsonl"  # the step log, always written
STEPS_CSV, EPOCHS_CSV = "steps.csv", "epochs.csv"  # logging.csv=true
TENSORBOARD_DIR = "tensorboard"  # logging.tensorboard=true
PROFILE_DIR = "profile"  # profile.steps, where profile.dir is not given
CHECKPOINTS_DIR = "checkpoints"  # where checkpoint.dir is not given
EXPORT_FILE = "model.keras"  # checkpoint.export
PRESET_DIR = "preset"  # checkpoint.export of a KerasHub task: the trained task as a preset
ADAPTER_FILE = (
    "adapter.lora.h5"  # a LoRA run's adapters (meshrun's own file, load_adapter): kept, and exported
)
HF_DIR = "hf"  # checkpoint.export of a transformers model.preset: the trained model as one
PEFT_DIR = "peft"  # and a LoRA run's adapters as a PEFT adapter on model.preset
PROCESSES_FILE = "processes.json"  # a local multi-process job: its processes and coordinator
ERROR_LOG = "error.log"  # the traceback of a run that failed
HYDRA_DIR = ".hydra"  # Hydra's record of the composed config and the overrides
SUMMARY_FILES = ("summary.csv", "summary.json", "summary.png")  # a sweep dir's comparison of its runs
UNFINISHED_PREFIX = (
    "unfinished-run-"  # unfinished-run-1/...: an unfinished run's files, moved aside by the next run there
)

# What a run itself writes into its run dir (meshrun.launch.reuse): every run that began training writes
# one of RUN_RECORDS, so a dir holding one holds a run (a user's own checkpoints/ in a dir given as
# hydra.run.dir does not make one), and RUN_OUTPUTS are all of its files. Hydra's own (.hydra/, the job
# log) and the launchers' (processes.json, process-*.log) are not among them: they are written for each
# launch before the run starts, and continued.
RUN_RECORDS = (METRICS_FILE, LOG_FILE, PLAN_FILE, ERROR_LOG)
RUN_OUTPUTS = (
    *RUN_RECORDS,
    STEPS_CSV,
    EPOCHS_CSV,
    TENSORBOARD_DIR,
    PROFILE_DIR,
    CHECKPOINTS_DIR,
    EXPORT_FILE,
    PRESET_DIR,
    ADAPTER_FILE,
    HF_DIR,
    PEFT_DIR,
)


def process_log(run_dir: str | Path, process_id: int) -> Path:
    """The log file of process `process_id` of a multi-process job (all but the first write there)."""
    return Path(run_dir) / f"process-{process_id}.log"


def job_log(run_dir: str | Path, job_name: str) -> Path:
    """Hydra's log file of job `job_name` in its run dir."""
    return Path(run_dir) / f"{job_name}.log"
