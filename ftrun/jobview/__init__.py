"""What a job is and was, folded from its event log: the one model `status` and `inspect` render.

    views.py  the dataclasses (JobView, Generation, Incident) and the numbers derived from them
    fold.py   events → JobView (pure, but for asking the OS whether the controller still runs)
    ranks.py  the current generation's ranks: host, local rank, pid, running or how it ended
    load.py   a job directory → JobView: the journal folded, plus what each restart restored
    timeline.py  JobView → what `inspect --html/--png` draw (phases.py: an incident's pieces)

Imports only the ground floor (the journal); only the CLI imports it.
"""

from ftrun.jobview.fold import controller_alive, fold, fold_hosts
from ftrun.jobview.load import RESTORE_LINE, RESTORE_SCAN_BYTES, load_job, read_restore
from ftrun.jobview.ranks import RankView
from ftrun.jobview.views import STATES, Generation, Incident, JobView

__all__ = [
    "RESTORE_LINE",
    "RESTORE_SCAN_BYTES",
    "STATES",
    "Generation",
    "Incident",
    "JobView",
    "RankView",
    "controller_alive",
    "fold",
    "fold_hosts",
    "load_job",
    "read_restore",
]
