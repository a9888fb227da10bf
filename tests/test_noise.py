"""The gradient noise scale: the estimator against a known covariance, and real
per-match gradients of a small policy."""

import subprocess
import sys

import numpy as np

from conftest import refused_in_one_line
from pgpong.noise import noise_scale, per_match_gradients
from pgpong.policy import Params


def test_noise_scale_recovers_a_known_signal_and_noise():
    rng = np.random.default_rng(0)
    H, D, n = 4, 50, 4000
    mean = Params(rng.normal(size=(H, D)), rng.normal(size=H))
    sigma = 3.0  # every coordinate's noise: tr(Sigma) = sigma^2 * (H * D + H)
    grads = (Params(mean.W1 + sigma * rng.normal(size=(H, D)), mean.W2 + sigma * rng.normal(size=H)) for _ in range(n))
    found = noise_scale(grads)
    trace = sigma**2 * (H * D + H)
    g2 = float((mean.W1**2).sum() + (mean.W2**2).sum())
    assert abs(found["trace_sigma"] / trace - 1) < 0.02
    assert abs(found["g_squared"] / g2 - 1) < 0.05
    assert abs(found["b_simple_matches"] / (trace / g2) - 1) < 0.06


def test_pure_noise_has_no_finite_scale_and_real_matches_give_numbers():
    rng = np.random.default_rng(1)
    zero_mean = (Params(rng.normal(size=(2, 5)), rng.normal(size=2)) for _ in range(2000))
    found = noise_scale(zero_mean)
    assert abs(found["g_squared"]) < 0.01 * found["trace_sigma"]  # about 0: no signal to see
    weights = Params.initial(8, 0)
    pairs = list(per_match_gradients(weights, 4, 0, "ALE/Pong-v5", 400))  # long enough to score
    assert [steps for _, steps in pairs] == [400] * 4
    found = noise_scale(g for g, _ in pairs)
    assert found["matches"] == 4 and found["trace_sigma"] > 0


def test_the_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    from pgpong.checkpoint import TrainingState, save_checkpoint
    from pgpong.noise import main

    damaged = tmp_path / "ckpt-000001.npz"
    damaged.write_bytes(b"PK\x03\x04 not really a zip archive")
    weights = Params.initial(4, 0)
    other = TrainingState(weights, weights.zeros_like(), info={"env_id": "ALE/Breakout-v5"})
    breakout = save_checkpoint(other, tmp_path / "breakout")
    unknown = save_checkpoint(TrainingState(weights, weights.zeros_like(), info={"env_id": "x" * 500}), tmp_path / "x")
    for given, says in [
        ([str(breakout)], "environment id 'ALE/Breakout-v5' is not Pong"),  # the checkpoint's id, checked too
        ([str(unknown)], "unknown environment id 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (500 characters)"),
        ([""], "argument checkpoints: an empty path"),
        ([str(tmp_path / "nowhere.npz")], "nowhere.npz: no such file or directory"),
        ([str(damaged)], "ckpt-000001.npz: not a .npz archive, or truncated or damaged"),
        ([str(tmp_path)], "ckpt-000001.npz: not a .npz archive"),  # a run directory: its newest checkpoint
        (["--matches", "1"], "--matches must be at least 2, got 1"),
        (["--matches", "two"], "argument --matches: invalid int value: 'two'"),
        (["--seed", "-1"], "--seed must be in [0, 2**32), got -1"),
        (["--max-episode-steps", "0"], "--max-episode-steps must be at least 1, got 0"),
    ]:
        assert says in refused_in_one_line(main, given, "python -m pgpong.noise", capsys), given


def test_the_command_prints_a_table_of_real_matches(capsys):
    from pgpong.noise import main

    assert main(["initial", "--matches", "2", "--max-episode-steps", "60"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| policy | matches | mean match steps |") and len(out) == 3
    assert out[2].startswith("| initial weights (H=200, seed 0) | 2 | 60 |")


def test_ctrl_c_while_numpy_and_the_emulator_load_ends_in_one_line():
    """The command's module loads nothing heavy itself (numpy, numba, the emulator take
    most of a second): they load inside main's handling of Ctrl-C, which ends with 130
    and one line. The interrupt is raised by numpy's import, so no timing is involved."""
    interrupting = (
        "import sys\n"
        "from pgpong.noise import main\n"
        "assert 'numpy' not in sys.modules, 'pgpong.noise loaded numpy itself'\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'numpy':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.exit(main(['initial', '--matches', '2', '--max-episode-steps', '10']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", interrupting], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stdout == "", proc.stderr
    assert proc.stderr == "python -m pgpong.noise: stopped (Ctrl-C); nothing measured is printed\n"
