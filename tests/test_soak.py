"""Chaos soak in CI: 8 batches on 2 Ray workers with a worker killed about every 2 s;
the weights equal an undisturbed run's and progress.csv counts every kill. (`make soak`
runs the same for 10 minutes.)"""

import pytest

from soak import soak


@pytest.mark.slow
def test_training_under_fire_ends_with_the_undisturbed_weights(tmp_path):
    report = soak(tmp_path, batches=8, seconds=None, kill_every=2.0)
    assert report["exit_status"] == 0, report
    assert report["batches"] == 8
    assert report["kills"] >= 2, report  # the run really was under fire
    assert report["replaced"] == report["kills"], report  # every kill found, replaced and counted
    assert report["weights_identical"], report
