#!/bin/bash
# Written by `ftrun sbatch` for ftrun job train-0a1b2c.
#SBATCH --job-name=llama
# 16 training nodes + 2 hot spares
#SBATCH --nodes=18
# one ftrun agent per node; it starts the node's ranks
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=2-00:00:00
#SBATCH --partition=gpu
# a failed node must not end the allocation: ftrun replaces it
#SBATCH --no-kill
# the job is never requeued: it ends where it stops
#SBATCH --no-requeue
# SIGUSR1 to the controller only (B:) 300 s before the time limit; the ranks get 285 s to checkpoint
#SBATCH --signal=B:USR1@300
# output into the job directory, kept across requeues
#SBATCH --output=/scratch/runs/train-0a1b2c/slurm-%j.out
#SBATCH --open-mode=append
# run where `ftrun sbatch` ran, so SCRIPT and relative paths resolve
#SBATCH --chdir=/home/ada/proj
# --sbatch-arg, as given (last: an option given twice, the last wins)
#SBATCH --qos=high
#SBATCH --exclusive
#SBATCH -A research

# No --export: sbatch's default (ALL) carries the submitting shell's environment
# (virtualenv, PYTHONPATH, FTRUN_*, NCCL_*...) into the job as it was.
# The one step is the ftrun controller, exec'ed so that Slurm's signal reaches it
# directly (bash would hold a trap until its child exits); it starts an agent on
# every node with srun and supervises the ranks.
exec /home/ada/venv/bin/python -m ftrun launch \
    --slurm \
    --job-id train-0a1b2c \
    --job-name llama \
    --run-dir /scratch/runs \
    --slurm-spares 2 \
    --preempt-signal SIGUSR1 \
    --preempt-grace 285 \
    --no-requeue \
    --nproc-per-node 8 \
    --max-restarts 10 \
    --progress-regex 'step (\d+)' \
    --cold-start \
    -- train.py
