#!/bin/bash
#SBATCH --job-name=resnet50-ddp
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2          # one task per GPU
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --mem=512M
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out
#SBATCH --error=%x-%j.err
#SBATCH --signal=B:USR1@120          # time to write a checkpoint
#SBATCH --requeue
#SBATCH --mail-type=END,FAIL
#SBATCH --mail-user=someone@example.org

# Multi-GPU data-parallel training on one node: one process per GPU.
set -euo pipefail
trap 'echo "checkpointing before the time limit"' USR1

echo "job ${SLURM_JOB_ID} (${SLURM_JOB_NAME}) on ${SLURM_JOB_NODELIST}"
echo "tasks ${SLURM_NTASKS}, per node ${SLURM_NTASKS_PER_NODE}, cpus per task ${SLURM_CPUS_PER_TASK}"
IFS=, read -ra DEVICES <<< "${CUDA_VISIBLE_DEVICES}"
export MASTER_ADDR="${SLURM_JOB_NODELIST%%,*}" MASTER_PORT=29500
for rank in $(seq 0 $((SLURM_NTASKS - 1))); do
    echo "rank ${rank} of ${SLURM_NTASKS} on ${DEVICES[$rank]}"
done
echo "training done" >&2
