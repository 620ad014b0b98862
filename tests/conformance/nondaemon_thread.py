"""Leaves a non-daemon thread running when the script's main code ends: the interpreter waits
for it (threading._shutdown) before atexit handlers and exit."""

import atexit
import threading
import time

import torch.distributed as dist
from _conf import maybe_die, say

dist.init_process_group("gloo")
for step in range(4):
    maybe_die(step)
    dist.barrier()
done = threading.Event()


def flusher() -> None:
    time.sleep(0.5)  # outlives the main code on purpose: this is the behaviour under test
    say("thread finished")
    done.set()


atexit.register(lambda: say("atexit after thread", done.is_set()))
threading.Thread(target=flusher).start()
say("main code done")
