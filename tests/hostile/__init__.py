"""Hostile input: fuzzed decoders and readers, and live attacks against running jobs.

Each test attacks one thing and asserts the attack fails: the job goes on or ends with a recorded
cause, and nothing is written outside the job's own directories (docs/security.md)."""
