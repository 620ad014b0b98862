#!/bin/bash
# Written by `ftrun sbatch` for ftrun job train-0a1b2c.
#SBATCH --job-name=train
# 4 training nodes, no spare
#SBATCH --nodes=4
# one ftrun agent per node; it starts the node's ranks
#SBATCH --ntasks-per-node=1
#SBATCH --time=4:00:00
# a failed node must not end the allocation: ftrun replaces it
#SBATCH --no-kill
# the job may go back in the queue and start again, as the same ftrun job
#SBATCH --requeue
# SIGUSR2 to the controller only (B:) 90 s before the time limit; the ranks get 75 s to checkpoint
#SBATCH --signal=B:USR2@90
# output into the job directory, kept across requeues
#SBATCH --output=/home/ada/.ftrun/runs/train-0a1b2c/slurm-%j.out
#SBATCH --open-mode=append
# run where `ftrun sbatch` ran, so SCRIPT and relative paths resolve
#SBATCH --chdir=/home/ada/proj

# No --export: sbatch's default (ALL) carries the submitting shell's environment
# (virtualenv, PYTHONPATH, FTRUN_*, NCCL_*...) into the job as it was.
# The one step is the ftrun controller, exec'ed so that Slurm's signal reaches it
# directly (bash would hold a trap until its child exits); it starts an agent on
# every node with srun and supervises the ranks.
exec /home/ada/venv/bin/python -m ftrun launch \
    --slurm \
    --job-id train-0a1b2c \
    --job-name train \
    --run-dir /home/ada/.ftrun/runs \
    --slurm-spares 0 \
    --preempt-signal SIGUSR2 \
    --preempt-grace 75 \
    --requeue \
    --nproc-per-node 8 \
    -- train.py --lr 3e-4
