#!/bin/bash
#SBATCH -J lr-sweep
#SBATCH -a 0-3%2                     # four learning rates, two at a time
#SBATCH -G 1
#SBATCH -c 1
#SBATCH -t 5
#SBATCH -o sweep_%A_%a.out

# A hyper-parameter sweep: each array task trains with its own learning rate.
LRS=(0.1 0.03 0.01 0.003)
LR=${LRS[$SLURM_ARRAY_TASK_ID]}
echo "task ${SLURM_ARRAY_TASK_ID} of ${SLURM_ARRAY_TASK_COUNT} (array ${SLURM_ARRAY_JOB_ID}) lr=${LR} gpu=${CUDA_VISIBLE_DEVICES}"
