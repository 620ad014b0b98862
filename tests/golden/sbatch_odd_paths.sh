#!/bin/bash
# Written by `ftrun sbatch` for ftrun job my-run-0a1b2c.
#SBATCH --job-name='my run #2 '"'"'final'"'"''
# 2 training nodes, no spare
#SBATCH --nodes=2
# one ftrun agent per node; it starts the node's ranks
#SBATCH --ntasks-per-node=1
# a failed node must not end the allocation: ftrun replaces it
#SBATCH --no-kill
# the job may go back in the queue and start again, as the same ftrun job
#SBATCH --requeue
# SIGUSR2 to the controller only (B:) 90 s before the time limit; the ranks get 75 s to checkpoint
#SBATCH --signal=B:USR2@90
# output into the job directory, kept across requeues
#SBATCH --output='/data/ada'"'"'s runs/with space/my-run-0a1b2c/slurm-%j.out'
#SBATCH --open-mode=append
# run where `ftrun sbatch` ran, so SCRIPT and relative paths resolve
#SBATCH --chdir='/home/ada/my proj'
# --sbatch-arg, as given (last: an option given twice, the last wins)
#SBATCH --comment="two words"

# No --export: sbatch's default (ALL) carries the submitting shell's environment
# (virtualenv, PYTHONPATH, FTRUN_*, NCCL_*...) into the job as it was.
# The one step is the ftrun controller, exec'ed so that Slurm's signal reaches it
# directly (bash would hold a trap until its child exits); it starts an agent on
# every node with srun and supervises the ranks.
exec '/opt/py env/bin/python' -m ftrun launch \
    --slurm \
    --job-id my-run-0a1b2c \
    --job-name 'my run #2 '"'"'final'"'"'' \
    --run-dir '/data/ada'"'"'s runs/with space' \
    --slurm-spares 0 \
    --preempt-signal SIGUSR2 \
    --preempt-grace 75 \
    --requeue \
    --env 'GREETING=hi there' \
    --env-file 'my env/.env' \
    -- 'scripts/it'"'"'s a "train".py' --name 'a b' --glob '*.pt' --money '$HOME' --empty ''
