#!/bin/sh
echo "hello from shell rank=$RANK args=$*"
