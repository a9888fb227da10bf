#!/bin/bash
B=/work/main/.venv/bin/pgpong
export RAY_USAGE_STATS_ENABLED=0
$B bench --simulate 1x64 --batch-sizes 1,10,60 --pace 2600 --json > rows-1x64-early.json 2> rows-1x64-early.err
$B bench --simulate 11x18 --batch-size 300 --pace 2600 --json > rows-11x18-early.json 2> rows-11x18-early.err
$B bench --simulate 1x64 --batch-sizes 1,10,60 --bank-policy shipped --pace 2600 --json > rows-1x64-late.json 2> rows-1x64-late.err
$B bench --simulate 11x18 --batch-size 300 --bank-policy shipped --pace 2600 --json > rows-11x18-late.json 2> rows-11x18-late.err
$B bench --simulate 1x64 --batch-size 60 --lag 1 --pace 2600 --json > rows-1x64-lag1-early.json 2> rows-1x64-lag1-early.err
$B bench --simulate 11x18 --batch-size 300 --lag 1 --pace 2600 --json > rows-11x18-lag1-early.json 2> rows-11x18-lag1-early.err
$B bench --simulate 1x64 --batch-size 60 --lag 1 --bank-policy shipped --pace 2600 --json > rows-1x64-lag1-late.json 2> rows-1x64-lag1-late.err
$B bench --simulate 11x18 --batch-size 300 --lag 1 --bank-policy shipped --pace 2600 --json > rows-11x18-lag1-late.json 2> rows-11x18-lag1-late.err
$B bench --simulate 1x64 --batch-size 60 --json > rows-1x64-b60-ownpace.json 2> rows-1x64-b60-ownpace.err
echo done > DONE
