# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Learning to play Pong from pixels, with pgpong
#
# This is the story of the Ray documentation's "Learning to Play Pong" (itself
# Andrej Karpathy's 2016 "Pong from Pixels") told with pgpong's own code: a
# two-layer network looks at the difference of two screens of Atari Pong and
# decides to move its paddle up or down; it plays whole matches against the
# game's built-in player, and after every batch of matches the moves that came
# before a won point are made likelier and those before a lost point less likely
# (REINFORCE). The matches of a batch are played in parallel on Ray.
#
# The public API is `pgpong.train`, `pgpong.Agent`, `pgpong.evaluate_agent` and
# the two pictures; to show the inside, some cells also use pgpong's modules
# (`pgpong.frames`, `pgpong.policy`, `pgpong.returns`, `pgpong.envs`,
# `pgpong.rollout`, `pgpong.pool`, `pgpong.cluster`), which are private: they may
# change between versions.
#
# This notebook is kept as `docs/tutorial.py` (a jupytext script, for review) and
# `docs/tutorial.ipynb` (with its outputs). `make test` runs it from top to bottom
# with a small budget (`PGPONG_TUTORIAL=quick`); `make tutorial` runs it in full
# and saves the outputs (5-8 minutes on 2 cores).

# %% tags=["parameters"]
import os

QUICK = os.environ.get("PGPONG_TUTORIAL") == "quick"  # the tests' budget: seconds instead of minutes
MATCH_STEPS = 300 if QUICK else None  # cut the single matches below short (None: whole matches)
BATCH = 4 if QUICK else 10  # matches played in parallel in the Ray section
TRAIN_UNTIL = -20.5 if QUICK else -10.0  # the short training run stops at this running reward...
TRAIN_SECONDS = 10 if QUICK else 360  # ... or after this many seconds
EVAL_MATCHES = 2 if QUICK else 10
GIF_STEPS = 40 if QUICK else 300  # agent steps in the GIF (15 a second)

# %%
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

import pgpong

WORK = Path(tempfile.mkdtemp(prefix="pgpong-tutorial-"))  # the run and the GIF go here
print(f"pgpong {pgpong.__version__}; files in {WORK}")

# %% [markdown]
# ## 1. A frame, and what the network sees
#
# Gymnasium's `ALE/Pong-v5` gives a 210x160 RGB screen after every step (4
# emulator frames; the agent plays the green paddle on the right). pgpong keeps
# rows 35-194, every second row and column, and the red channel: an 80x80 image in
# which the background becomes 0 and the paddles and the ball 1. The network's input
# is the difference of two such images: +1 where something appeared, -1 where it
# left, 0 elsewhere.

# %%
import ale_py

from pgpong.frames import SIDE, preprocess, sparse_difference

gym.register_envs(ale_py)
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner
env = gym.make("ALE/Pong-v5")
frame, _ = env.reset(seed=0)
for step in range(44):  # the ball is served after about 30 steps
    previous = frame
    frame, *_ = env.step(2 if step % 6 < 3 else 3)  # 2 moves the paddle up, 3 down

mask, mask_before = preprocess(frame), preprocess(previous)
indices, values = sparse_difference(mask, mask_before)
difference = np.zeros(SIDE * SIDE)
difference[indices] = values

fig, axes = plt.subplots(1, 3, figsize=(12, 4.6), layout="constrained")
axes[0].imshow(frame)
axes[0].set_title(f"the screen: {frame.shape[0]}x{frame.shape[1]} RGB")
axes[1].imshow(mask.reshape(SIDE, SIDE), cmap="gray", interpolation="nearest")
axes[1].set_title(f"80x80: paddles and ball ({mask.sum()} pixels)")
colours = ListedColormap(["#4aa0ff", "black", "#ff9628"])  # -1 blue, 0 black, +1 orange
axes[2].imshow(difference.reshape(SIDE, SIDE), cmap=colours, vmin=-1, vmax=1, interpolation="nearest")
axes[2].set_title(f"the input: this minus the previous ({len(indices)} non-zero)")
for ax in axes:
    ax.set_axis_off()
plt.show()

# %% [markdown]
# Of the 6,400 inputs only a few dozen are not zero (about 27 on average over a
# match), which is what makes pgpong fast: the network reads only the columns of W1
# for those pixels.

# %% [markdown]
# ## 2. The network, and one forward pass
#
# Two layers and no biases: 200 hidden units `h = relu(W1 x)`, then one output
# `p = sigmoid(W2 . h)`, the probability of moving up. The weights start random
# ("Xavier": W1 ~ N(0, 1)/sqrt(6400), W2 ~ N(0, 1)/sqrt(200)).

# %%
from pgpong.policy import Params, forward

weights = Params.initial(hidden=200, seed=0)
h, p_up = forward(weights, indices, values)
print(f"W1 {weights.W1.shape}, W2 {weights.W2.shape}: {weights.nbytes / 2**20:.1f} MB of float32")
print(f"{np.count_nonzero(h)} of {len(h)} hidden units active; P(up) = {p_up:.3f}")

# %% [markdown]
# A new network is undecided: P(up) is close to 0.5, so it moves at random and loses
# about 21 to 0.

# %% [markdown]
# ## 3. One match, and its gradient
#
# A match is played with the network's own draws: after every step the action is
# drawn from P(up), and the step remembers its input, and the "fake label" minus
# P(up) (the gradient of the log-probability of what was done). At the end each
# step gets the discounted sum of the rewards that followed it (gamma = 0.99, reset
# at every point: only the point a move led to counts), standardised over the
# match; the gradient is the steps' fake-label gradients weighted by it.

# %%
from pgpong.returns import discounted_returns, standardise

rewards = np.array([0, 0, 0, -1, 0, 0, 0, 0, 1], dtype=np.int8)
returns = discounted_returns(rewards, 0.99)
print("rewards     ", rewards)
print("returns     ", returns.round(2))
print("standardised", standardise(returns).round(2))

# %% [markdown]
# `pgpong.rollout.play_episode` plays a whole match with given weights (on pgpong's
# own seeded copy of the environment, reset from an emulator snapshot) and returns
# its score and gradient. Only the W1 columns of pixels that changed at least once
# in the match can have a gradient, so only those are kept and sent back.

# %%
from pgpong.envs import make_env
from pgpong.rollout import EpisodeId, play_episode

pong = make_env("ALE/Pong-v5", MATCH_STEPS)
match = play_episode(pong, weights, EpisodeId(seed=0, batch=0, episode=0), gamma=0.99)
gradient = match.grad.dense()
print(
    f"score {match.score:+.0f} in {match.steps} steps ({match.seconds:.2f} s); the gradient has "
    f"{len(match.grad.columns)} of 6400 W1 columns, {match.grad.nbytes / 2**20:.2f} MB"
)

touched = np.zeros(SIDE * SIDE)
touched[match.grad.columns] = 1
unit = int(np.argmax(np.abs(gradient.W1).sum(axis=1)))
fig, axes = plt.subplots(1, 2, figsize=(9, 4.6), layout="constrained")
axes[0].imshow(touched.reshape(SIDE, SIDE), cmap="gray", interpolation="nearest")
axes[0].set_title("pixels the match changed at least once")
scale = np.abs(gradient.W1[unit]).max() or 1
axes[1].imshow(gradient.W1[unit].reshape(SIDE, SIDE), cmap="RdBu_r", vmin=-scale, vmax=scale, interpolation="nearest")
axes[1].set_title(f"the gradient of hidden unit {unit}'s weights")
for ax in axes:
    ax.set_axis_off()
plt.show()

# %% [markdown]
# The left picture shows the ball's paths and the two paddles' strips. On the right,
# red pixels are those whose weight into that unit this match would raise.

# %% [markdown]
# ## 4. Matches in parallel on Ray, and what a batch costs
#
# A batch's matches share nothing but the weights, so they are played at the same
# time by long-lived rollout workers, Ray actors that each create their Pong
# environment once. The weights are published once per batch in Ray's object
# store; each gradient comes back in float32 and is added in fixed point (integers),
# exactly, so the sum is the same bit for bit whichever worker played which match,
# in any order.

# %%
from pgpong.pool import WorkerSettings, open_pool

workers = min(2, os.cpu_count() or 1)
pool = open_pool(WorkerSettings("ALE/Pong-v5", MATCH_STEPS), workers, address=None)  # starts Ray here
batch = [EpisodeId(seed=0, batch=0, episode=k) for k in range(BATCH)]
began = time.perf_counter()
played = pool.play_batch(weights, batch)
summed = played.grad  # the batch's gradient, weights-shaped
seconds = time.perf_counter() - began
pool.close()
phases = ", ".join(f"{name} {s * 1000:.0f} ms" for name, s in played.measures.phases().items())
print(
    f"{BATCH} matches on {workers} Ray workers in {seconds:.2f} s ({seconds / BATCH:.2f} s a match; "
    f"one after another at the pace of section 3's match, about {BATCH * match.seconds:.1f} s)"
)
print(f"gradients into the driver: {played.measures.bytes_in / 2**20:.1f} MB; driver phases: {phases}")

# %% [markdown]
# Then one RMSProp step updates the weights with the summed gradient, and the next
# batch is played with them. A batch costs as long as its slowest worker's share of
# matches, plus the driver's publish, sums and step (a few milliseconds here); a
# match takes longer as the network improves, because good play makes longer
# matches. [SCALING.md](SCALING.md) models seconds per update for any number of
# workers and nodes.

# %% [markdown]
# ## 5. A short training run
#
# `pgpong.train` does all of this in a loop, writes a run directory (settings,
# `progress.csv`, checkpoints, TensorBoard events) and returns the run. Its settings
# are `pgpong train`'s flags (`batch_size` is `--batch-size`), with the same
# defaults: a batch of 10 matches, the learning rate 0.002, an entropy bonus of 0.01
# and each update clipped to norm 4 (`entropy_bonus=0, max_update_norm=0` give 2016's
# maths). `stop` ends it early: here at a running reward of -10 (the exponential
# average of match scores; a new network sits near -20.5, 0 is as good as the
# built-in player) or after a few minutes.
# Seed 0 is one of the quick ones (-10 after about 600 matches, 0 after about 930).
# In a notebook the live line above the batch lines shows the batch in progress;
# the stop button ends the run cleanly, with the last finished batch's checkpoint
# on disk. (The times shown are those of the machine that last ran this notebook:
# a 2-core one shared with other work.)

# %%
run = pgpong.train(
    WORK / "seed0",
    seed=0,
    workers=workers,
    batch_size=BATCH if QUICK else None,
    max_episode_steps=MATCH_STEPS,
    stop=lambda row: row.running_reward >= TRAIN_UNTIL or row.wall_s >= TRAIN_SECONDS,
)
run

# %%
run.plot()

# %% [markdown]
# ## 6. The shipped agent
#
# pgpong ships an agent trained for longer: 8,530 matches, 2.2 hours in one process
# (its learning curve is in the README; over 100 matches it wins 99, mean score +13). `pgpong.Agent.load()` loads it (or a run directory, a
# checkpoint, a W1/W2 `.npz`), and `pgpong.evaluate_agent` judges it as `pgpong
# play` does: seeded matches against the built-in player.

# %%
agent = pgpong.Agent.load(seed=0)
summary = pgpong.evaluate_agent(agent, EVAL_MATCHES, workers=workers, max_episode_steps=MATCH_STEPS)
print(summary)

# %% [markdown]
# An agent plays in any loop of your own: it takes Gymnasium's raw frames, keeps the
# previous one itself (`reset()` at a new match) and answers 2 (up) or 3 (down).

# %%
frame, _ = env.reset(seed=1)
agent.reset()
score, steps, done = 0.0, 0, False
while not done:
    frame, reward, terminated, truncated, _ = env.step(agent.act(frame))
    score, steps = score + reward, steps + 1
    done = terminated or truncated or steps == MATCH_STEPS
print(f"the shipped agent, in a plain Gymnasium loop: {score:+.0f} in {steps} steps")

# %% [markdown]
# Here it is playing (the first 20 seconds of match 1 of `pgpong play --seed 2`),
# beside what its network sees and its probability of moving up:

# %%
from IPython.display import Image

pgpong.evaluate_agent(
    agent, 1, seed=2, workers=0, max_episode_steps=GIF_STEPS, record=WORK / "match.gif", progress=False
)
Image(filename=WORK / "match.gif")

# %% [markdown]
# ## 7. What its hidden units look at
#
# Each hidden unit's 6,400 weights drawn as an 80x80 image: red where a paddle or
# ball pixel raises the unit, blue where it lowers it. The diagonals are ball
# trajectories; the vertical strokes at the left and right are paddle positions.

# %%
pgpong.plot_weights(agent, units=20)

# %% [markdown]
# ## 8. Where to go next
#
# - **A longer run**: `pgpong.train()` (or `make train` in a shell) runs until you
#   stop it; on 2 cores it reaches the built-in player's level (running reward 0)
#   in about 4-6 minutes on most seeds. `pgpong.train(run_dir=...)` resumes a run,
#   to exactly the weights an uninterrupted run would have had.
# - **A cluster**: `pgpong.train(address="HEAD_IP:6379", batch_size=60)` plays on
#   every CPU of an existing Ray cluster (see the README's "Running on a cluster").
# - **A study**: `pgpong study` runs a grid of settings x seeds on Ray Tune and
#   reports how many seeds reach a running reward, and how fast
#   ([LEARNING.md](LEARNING.md) has every study behind pgpong's defaults).
# - **How it works**: [ALGORITHM.md](ALGORITHM.md) says exactly what is computed,
#   [ARCHITECTURE.md](ARCHITECTURE.md) where in the code.

# %%
from pgpong.cluster import stop_ray

env.close()
pong.close()
stop_ray()  # the Ray instance the pool section started
