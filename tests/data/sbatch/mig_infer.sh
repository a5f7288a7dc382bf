#!/bin/bash
#SBATCH --job-name=llm-infer
#SBATCH --gres=gpu:1g.10gb:1         # one MIG slice is plenty for a small model
#SBATCH --cpus-per-task=1
#SBATCH --time=0:05:00
#SBATCH --output=infer-%j.out

# Batch inference on one MIG slice: CUDA sees exactly that slice.
echo "serving on ${CUDA_VISIBLE_DEVICES}"
