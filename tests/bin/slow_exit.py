"""Steps quickly, then takes a few seconds to exit (an atexit handler: finalization work, as a
process with torch loaded has on a busy host). Not a hang once the script's code has returned."""

import atexit
import time

atexit.register(time.sleep, 3)
for step in range(1, 6):
    print(f"step {step}", flush=True)
    time.sleep(0.05)
