"""What `meshrun --help`, `meshrun COMMAND --help` and `meshrun --version` print: plain text, with
no import of Hydra, jax or keras (the groups listed under train's, plan's and sweep's help come from
meshrun.app)."""

from __future__ import annotations

from importlib import metadata

USAGE = """\
usage: meshrun train  [OVERRIDE ...] [-m] [--cfg job]
       meshrun plan   [OVERRIDE ...] [-m] [--json] [--full] [--save-layout FILE.yaml] [--fit batch|seq_len]
       meshrun sweep  [OVERRIDE ...]
       meshrun report DIR [DIR ...] [--out DIR]
       meshrun generate RUN_DIR --prompt TEXT [--prompt TEXT ...] [--max-length N] [--json]
       meshrun preset FAMILY --text PATH [--text PATH ...] --out DIR [--vocabulary N] [--layers N]
                      [--hidden N] [--heads Q:KV] [--seq-len N] [--seed N] [--force]
       meshrun k8s    [OVERRIDE ...] --image IMAGE --nodes N [--kind trainjob|indexed-job]
                      [--volume CLAIM:PATH] [--name NAME] [--namespace NS] [--port PORT] [--user UID:GID]
                      [--pull-secret SECRET] [--no-network-policy] [--out FILE] [--apply | --simulate]
       meshrun COMMAND --help        # that command's flags, and the config groups it takes
       meshrun --version             # meshrun's version and those of jax, jaxlib, keras and keras-hub

train: trains a Keras model on a device mesh described by Hydra config, then prints and writes a
report (metrics.json and plan.json in the run dir).
plan: trains nothing and allocates no model memory; shows where every variable lives and how many
bytes land on each device, and lints the layout (exit 2 on errors).
sweep: trains on every mesh shape of the available devices (a multirun) and compares the jobs.
report: the comparison table and summary files of an existing sweep dir, or of any run dirs.
generate: completes prompts with the model a KerasHub run trained, on the run's own mesh.
preset: makes a small KerasHub preset (gemma, llama, mistral, gpt2) with a tokenizer trained on your
text and random weights, offline: something to try fine-tuning with.
k8s: the job `meshrun train` would run, as Kubernetes objects (a Kubeflow TrainJob or an Indexed
Job), one pod per process; writes their YAML, submits them (--apply) or runs the pods here (--simulate).

  meshrun train mesh=2x4 layout=dense_model        # a 2x4 (data, model) mesh, the seeds' rules
  meshrun train -m mesh=8x1,4x2,2x4,1x8 layout=dense_model
  meshrun sweep layout=dense_model                 # the same four shapes, found for you
  meshrun sweep model=transformer layout=auto,transformer_tp devices.memory_gib=80
                                                   # meshes x layouts that fit
  meshrun report multirun/2026-11-21/10-00-00      # re-render a sweep's table and files
  meshrun generate outputs/2026-11-25/10-00-00 --prompt 'Once upon a time'
                                                   # complete with a trained KerasHub LM
  meshrun preset gemma --text 'data/*.jsonl' --out tiny_gemma
                                                   # a small Gemma to fine-tune: model.preset=tiny_gemma
  meshrun train model=transformer mesh=2x4         # models: dense_model, cnn, transformer, two_tower
  meshrun train model=python model.factory=mymodels:build train.loss=mse         # your own Keras model
  meshrun train model=keras_hub model.task=LlamaCausalLM 'model.backbone={...}' layout=from_model
  meshrun train recipe=transformer_2d              # a complete experiment from recipes/
  meshrun plan model=transformer model.preset=7b mesh=1x8 layout=transformer_tp
  meshrun plan model=transformer mesh=1x8 layout=auto --save-layout tp.yaml    # then: layout=./tp.yaml
  meshrun train --cfg job                          # print the composed config
  meshrun k8s mesh=2x8 --image reg/meshrun:0.1 --nodes 2 --volume runs:/runs --out job.yaml   # for Kubernetes
  meshrun train --help                             # config groups and their options
"""

OVERRIDES = """\
OVERRIDE: Hydra's key=value (train.epochs=5), group=option (model=transformer, layout=auto), or a
mesh shape (mesh=2x4, mesh=[2,4]; -1 once: every remaining device). A user's config dir joins
meshrun's with hydra.searchpath=[file://DIR]. `meshrun train --cfg job` prints the composed config.
"""

COMMAND_HELP = {
    "train": """\
usage: meshrun train [OVERRIDE ...] [-m] [--cfg job|hydra|all [--resolve] [--package PACKAGE]] [--info [WHAT]]

Trains a Keras model on a device mesh described by Hydra config, then prints and writes a report.
The run dir (outputs/DATE/TIME/, or hydra.run.dir=DIR) holds metrics.json, plan.json, log.jsonl (a
line per step and per epoch), train.log and the composed config (.hydra/); switches add the rest:
logging.csv=true steps.csv and epochs.csv, logging.tensorboard=true tensorboard/,
checkpoint.every_epoch=true checkpoints/, checkpoint.export=true model.keras, profile.steps=[A,B] profile/.

  -m, --multirun            one job per combination of comma-separated values (mesh=2x4,4x2 layout=a,b);
                            the jobs are compared at the end (summary.csv, summary.json, summary.png)
  -c, --cfg job|hydra|all   print the composed config (hydra: Hydra's own; all: both) instead of training
  --resolve                 with --cfg: interpolations resolved
  -p, --package PACKAGE     with --cfg: only that part of the config, e.g. --package train
  -i, --info [WHAT]         Hydra's information about the config: all (default), config, defaults,
                            defaults-tree, plugins or searchpath

  meshrun train mesh=2x4 layout=dense_model
  meshrun train -m mesh=8x1,4x2,2x4,1x8 layout=dense_model
""",
    "plan": """\
usage: meshrun plan [OVERRIDE ...] [-m] [--json] [--full] [--save-layout FILE.yaml] [--fit batch|seq_len]

Trains nothing and allocates no model memory: shows where every variable lives and how many bytes
land on each device, and lints the layout (exit 2 on errors). Takes the overrides `meshrun train`
takes, so a plan is of exactly the run those overrides would make. With devices.memory_gib it also
counts the train step's own memory and peak (the step compiled on abstract inputs) and says whether
that fits.

  --json                   print the plan as JSON lines (one per job) instead of tables
  --full                   a row per variable (repeated blocks otherwise share a row: block_{0..31}/...)
  --save-layout FILE.yaml  write the rules in force (hand-written, the model's own or layout=auto's) as a
                           layout file that layout=FILE.yaml loads
  --fit batch|seq_len      the largest train.batch_size (or model.seq_len) whose train step fits
                           devices.memory_gib (a compile for each size tried)
  -m, --multirun           plan every job of a multirun

  meshrun plan model=transformer model.preset=7b mesh=1x8 layout=transformer_tp
  meshrun plan model=transformer mesh=1x8 layout=auto --save-layout tp.yaml
  meshrun plan model=transformer mesh=2x4 devices.memory_gib=0.004 --fit batch
""",
    "sweep": """\
usage: meshrun sweep [OVERRIDE ...]

Trains on every mesh shape of the available devices (a multirun: 8 devices, 2-D gives 8x1, 4x2, 2x4,
1x8) and compares the jobs, fastest first (summary.csv, summary.json, summary.png in the sweep dir).
With mesh=... given, it runs the shapes given instead; mesh.axis_names=[a,b,c] sweeps the shapes of
that many axes. layout=a,b varies the layout too; with devices.memory_gib, jobs whose plan does not
fit are recorded, not run.

  meshrun sweep layout=dense_model
  meshrun sweep model=transformer layout=auto,transformer_tp devices.memory_gib=80
  meshrun sweep mesh.axis_names=[data,model,seq] layout=dense_model     # the ten 3-D shapes of 8 devices
""",
    "report": """\
usage: meshrun report DIR [DIR ...] [--out DIR]

The comparison table of the runs under the dirs given (a sweep dir, or any run dirs holding a
metrics.json), fastest first; writes summary.csv, summary.json and summary.png into the one dir
given, or into --out (the working dir when several are given and no --out).

  --out DIR   where to write the summary files

  meshrun report multirun/2026-11-21/10-00-00
  meshrun report outputs/ other/run --out cmp/
""",
    "k8s": """\
usage: meshrun k8s [OVERRIDE ...] --image IMAGE --nodes N [--kind trainjob|indexed-job] [--volume CLAIM:PATH]
                   [--name NAME] [--namespace NS] [--port PORT] [--user UID:GID] [--pull-secret SECRET]
                   [--no-network-policy] [--out FILE] [--apply | --simulate]

Renders the job `meshrun train OVERRIDE ...` would run for Kubernetes: N pods, one meshrun process
each (distributed.mode=auto), each with an equal share of the mesh's devices (its GPUs, or none
with devices.platform=cpu). The config is composed and checked as train checks it, and against the
pods (the whole mesh shape given, its devices split evenly over them, mesh.dcn one slice per pod).
The pods meet the restricted Pod Security Standard (non-root, no privilege escalation, no
capabilities, RuntimeDefault seccomp, no service-account token), and a NetworkPolicy lets only the
job's own pods reach them. Prints the objects as YAML; a bad flag or config is one line, exit 2,
nothing written.

  --image IMAGE        the container image the pods run; meshrun must be installed in it
  --nodes N            how many pods (processes)
  --kind KIND          trainjob (default): a Kubeflow Trainer v2 TrainJob on the jax-distributed runtime;
                       indexed-job: a headless Service and an Indexed Job, no operator needed
  --volume CLAIM:PATH  mount PersistentVolumeClaim CLAIM at PATH in every pod: the run dir is PATH/NAME,
                       its checkpoints/ resumed from when a pod is started again (resume=auto);
                       without it, the run and its checkpoints die with the pods (a warning says so)
  --name NAME          the job's name (default meshrun-DATE-TIME)
  --namespace NS       its namespace (default: the kubeconfig context's)
  --port PORT          process 0's coordinator port (indexed-job, and trainjob under --simulate;
                       default 55527)
  --user UID:GID       the numeric user and group the pods run as, not root (default 1000:1000); the
                       group owns the volume's files (fsGroup)
  --pull-secret SECRET the Secret holding the image registry's credentials (a TrainJob's pods, which run as
                       a ServiceAccount of their own, get none of the namespace's default one's)
  --no-network-policy  leave out the NetworkPolicy that lets only the job's own pods reach its pods
  --out FILE           write the YAML to FILE instead of printing it
  --apply              create the objects in the current kubeconfig context's cluster (pip install
                       'meshrun[k8s]') and print the kubectl commands that follow the job
  --simulate           run the pods here, as local processes with their pod spec's command and env
                       (service names -> 127.0.0.1, the volume -> ./k8s-volumes/CLAIM, the emptyDir ->
                       ./k8s-volumes/emptyDir-scratch); exits with the job's status

  meshrun k8s model=transformer mesh=2x8 --image reg/meshrun:0.1 --nodes 2 --volume runs:/runs --out job.yaml
  meshrun k8s devices.platform=cpu mesh=2x4 layout=dense_model --image reg/meshrun:0.1 --nodes 2 \\
    --kind indexed-job --simulate
""",
}


VERSIONED = ("meshrun", "jax", "jaxlib", "keras", "keras-hub")


def command_help(command: str) -> str:
    """The help of one command: its usage, what it does, its flags and examples, and for the
    commands that take overrides, how they are written."""
    text = COMMAND_HELP[command]
    return text + ("\n" + OVERRIDES if command in ("train", "plan", "sweep", "k8s") else "")


def versions_line() -> str:
    """meshrun's version and those of the libraries that decide how it behaves, on one line."""
    found = []
    for name in VERSIONED:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"{found[0]} ({', '.join(found[1:])})"
