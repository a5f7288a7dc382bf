#!/bin/sh
#SBATCH --job-name=train
#SBATCH --gres=gpu:1
#SBATCH --time=0:05:00
#SBATCH --output=train.out
# Second step: submitted with --dependency=afterok:<prep job>; fails without its input.
test -s dataset.txt || { echo "no data set" >&2; exit 3; }
echo "trained on $(wc -l < dataset.txt) samples with ${CUDA_VISIBLE_DEVICES}"
