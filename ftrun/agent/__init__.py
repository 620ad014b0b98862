"""The per-host agent: starts torchrun for each generation, watches its ranks, relays their logs
and progress, kills on command, and fences itself when it loses the controller.

The agent imports only the standard library and psutil: it must start fast on any host.
"""
