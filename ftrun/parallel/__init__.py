"""ftrun.parallel: train a model under a DP x PP plan (FTRUN_PLAN), or DP-only without one.

    import ftrun.parallel as par

    run = par.Parallel(model, loss_fn=lm_loss, samples=dataset.get,
                       global_batch=48, micro_batch=4, memory_budget="64MiB")
    opt = torch.optim.AdamW(run.module.parameters(), lr=1e-3)
    loss = run.step(opt, batch=s)         # one optimizer step of global batch s, global mean loss

Runs inside ranks, like ftrun.checkpoint: imports neither the CLI nor the controller, and its
`module` is keyed by the full model's names, so ftrun.checkpoint reshards across layouts.
Modules: plan.py (the plan), mesh.py (device mesh), stages.py (cutting, DDP, schedules),
memory.py (the budget), profile.py (profile.json), runner.py (Parallel). Importing this package
imports torch but builds nothing.
"""

from __future__ import annotations

from ftrun.parallel.memory import BudgetError, parse_bytes
from ftrun.parallel.plan import SCHEDULES, Plan, PlanError
from ftrun.parallel.runner import Parallel

__all__ = ["Parallel", "Plan", "PlanError", "BudgetError", "SCHEDULES", "parse_bytes"]
