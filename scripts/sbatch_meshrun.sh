#!/usr/bin/env bash
# A meshrun job on a SLURM cluster without Hydra's submitit launcher: one task per node, each task
# one process of the job, every process finding its place from SLURM's environment
# (distributed=auto). Arguments are meshrun train overrides:
#
#   sbatch scripts/sbatch_meshrun.sh model=transformer mesh=2x8 layout=transformer_2d
#   sbatch --nodes=4 scripts/sbatch_meshrun.sh mesh=4x8 ...      # sbatch options override these
#
# Every task must write into the same run dir, so it is named after the job, not the clock. With
# --kill-on-bad-exit a task that fails ends the whole step instead of leaving the others waiting.
#SBATCH --job-name=meshrun
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=01:00:00
#SBATCH --output=slurm-%j.out
# On GPU nodes also ask for the node's GPUs, e.g.:
##SBATCH --gpus-per-node=8
set -euo pipefail

srun --kill-on-bad-exit=1 meshrun train distributed=auto "hydra.run.dir=outputs/slurm/${SLURM_JOB_ID}" "$@"
