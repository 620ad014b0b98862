"""The controller: one per job. Owns the job state, the restart budget and every decision.

It never imports torch: it supervises agents over the control plane and writes the journal.
"""
