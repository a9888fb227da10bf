#!/bin/bash
# ab.sh OUTDIR PAIRS "extra args" vA vB ...: `pgpong bench --simulate 1x64 --batch-size 60 --json` in turns,
# each version's source at /tmp/vX/src (git archive REV src | tar -x -C /tmp/vX); then turns.py OUTDIR vA vB
# (PGPONG: the pgpong command to run, from any venv; the source on PYTHONPATH is what runs)
out=$1; pairs=$2; extra=$3; shift 3
mkdir -p $out
for i in $(seq 1 $pairs); do
  for v in "$@"; do
    RAY_USAGE_STATS_ENABLED=0 PYTHONPATH=/tmp/$v/src ${PGPONG:-pgpong} bench --simulate 1x64 --batch-size 60 $extra --json > $out/$v-$i.json 2>/dev/null
  done
done
