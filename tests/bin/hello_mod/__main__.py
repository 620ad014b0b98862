import os
import sys

print(f"hello from module rank={os.environ.get('RANK')} args={sys.argv[1:]}", flush=True)
