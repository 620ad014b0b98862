"""Transports start one agent per host. One interface (base.Transport); backends: local (here).

SSH (fabric) and Slurm (srun) are further backends of the same interface: the agent and the
control plane do not change, only how the agent process is started and reached.
"""
