"""`pgpong study`: a grid of settings x seeds, each an ordinary pgpong run, trained in
parallel on Ray Tune (plan.py: the grid and its trials; runner.py: the Tune trials
and what the study shows while it runs; report.py: the thresholds table, from the
run directories alone)."""
