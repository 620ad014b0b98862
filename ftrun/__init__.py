"""ftrun: a fault-tolerant launcher that wraps torchrun.

Inside a training script, `import ftrun` gives the runtime API; importing it does no work.
"""

from ftrun.runtime import section, step

__version__ = "0.1.0"
__all__ = ["section", "step", "__version__"]
