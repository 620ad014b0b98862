#!/bin/sh
# A rank that writes a file and a directory into the job directory, as a training script writes
# logs and checkpoints (tests/hostile/live/test_permissions.py reads their modes).
echo "rank $RANK" >"$FTRUN_JOB_DIR/from-rank$RANK.txt"
mkdir "$FTRUN_JOB_DIR/dir-of-rank$RANK"
