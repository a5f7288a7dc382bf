#!/bin/sh
#SBATCH --job-name=prep
#SBATCH --time=0:02:00
#SBATCH --output=prep.out
# First step of a pipeline: write the data set the training step reads.
seq 1 5 > dataset.txt
echo "prepared $(wc -l < dataset.txt) samples"
