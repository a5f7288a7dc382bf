#!/bin/sh
#SBATCH --job-name=eval
#SBATCH -t 1
#SBATCH -o eval.out
# Last step: submitted with --dependency=afterok:<train job>.
echo "evaluated"
