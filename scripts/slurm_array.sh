#!/usr/bin/env bash
# The seed's grid as a Slurm job array: one task per shard, one GPU each, then a merge.
#
#   sbatch --array=0-5 scripts/slurm_array.sh          # 6 shards of the 36 conditions
#   poskernel grid --merge shards/0 shards/1 shards/2 shards/3 shards/4 shards/5 --out grid
#   poskernel report grid
#
# Shards are deterministic contiguous blocks (6 shards of the seed grid: one model each);
# each writes its own folder and resumes on resubmission. Weights must be in the local Hugging Face cache
# of the compute nodes (pre-download with `hf download <hub id>`).
#SBATCH --job-name=poskernel-grid
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=04:00:00
set -euo pipefail
N_SHARDS=${N_SHARDS:-${SLURM_ARRAY_TASK_COUNT:-6}}
I=${SLURM_ARRAY_TASK_ID:?run this script with sbatch --array=0-$((N_SHARDS - 1))}
poskernel grid --preset "${PRESET:-seed}" --shard "$I/$N_SHARDS" --out "shards/$I" \
    --device cuda --quiet
