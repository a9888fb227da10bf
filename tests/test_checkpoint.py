"""Checkpoints: round trip, atomic pruning, and refusal of damaged files."""

import json
import os

import numpy as np
import pytest

from pgpong.checkpoint import (
    CheckpointError,
    TrainingState,
    list_checkpoints,
    load_checkpoint,
    load_weights,
    save_checkpoint,
)
from pgpong.policy import Params


def make_state(batch=3, hidden=8):
    weights = Params.initial(hidden, seed=batch)
    cache = weights.zeros_like()
    cache.W1 += 0.5
    return TrainingState(
        weights,
        cache,
        batch=batch,
        episodes=batch * 10,
        env_steps=1234,
        running_reward=-20.25,
        wall_s=12.5,
        info={"env_id": "ALE/Pong-v5"},
    )


def test_round_trip(tmp_path):
    state = make_state()
    path = save_checkpoint(state, tmp_path)
    loaded = load_checkpoint(path)
    np.testing.assert_array_equal(loaded.weights.W1, state.weights.W1)
    np.testing.assert_array_equal(loaded.cache.W1, state.cache.W1)
    assert loaded.weights.W1.flags.f_contiguous and loaded.weights.W1.flags.writeable
    assert (loaded.batch, loaded.episodes, loaded.env_steps) == (3, 30, 1234)
    assert loaded.running_reward == -20.25 and loaded.wall_s == 12.5
    assert not list(tmp_path.glob(".*tmp"))  # no temporary file left behind


def test_plain_numpy_reads_w1_w2_with_spec_shapes(tmp_path):
    path = save_checkpoint(make_state(hidden=8), tmp_path)
    with np.load(path, allow_pickle=False) as data:
        assert data["W1"].shape == (8, 6400) and data["W2"].shape == (8,)


def test_weights_from_elsewhere_load(tmp_path):
    rng = np.random.default_rng(0)
    W1, W2 = rng.standard_normal((4, 6400)), rng.standard_normal(4)
    np.savez(tmp_path / "model.npz", W1=W1, W2=W2)
    weights = load_weights(tmp_path / "model.npz")
    np.testing.assert_allclose(weights.W1, W1.astype(np.float32))


def test_keeps_the_newest(tmp_path):
    for batch in range(1, 6):
        save_checkpoint(make_state(batch), tmp_path, keep=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000003.npz", "ckpt-000004.npz", "ckpt-000005.npz"]


def damage_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def damage_flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))


def damage_empty(path):
    path.write_bytes(b"")


def damage_garbage(path):
    path.write_bytes(b"this is not a checkpoint at all" * 10)


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_empty, damage_garbage])
def test_damaged_files_are_refused_with_their_name(tmp_path, damage):
    path = save_checkpoint(make_state(), tmp_path)
    damage(path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def rewrite(path, **changes):
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(arrays["header"].tobytes())
    for key, value in changes.items():
        if key in header:
            header[key] = value
        else:
            arrays[key] = value
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_wrong_version_is_refused(tmp_path):
    path = save_checkpoint(make_state(), tmp_path)
    rewrite(path, version=99)
    with pytest.raises(CheckpointError, match="version 99"):
        load_checkpoint(path)


def test_wrong_shape_is_refused(tmp_path):
    path = save_checkpoint(make_state(), tmp_path)
    rewrite(path, W1=np.zeros((8, 100), np.float32))
    with pytest.raises(CheckpointError, match=r"W1 has shape \(8, 100\)"):  # found from the header, before any checksum
        load_checkpoint(path)


def test_array_changed_behind_the_header_fails_the_checksum(tmp_path):
    path = save_checkpoint(make_state(), tmp_path)
    with np.load(path, allow_pickle=False) as data:
        W2 = data["W2"].copy()
    W2[0] += 1
    rewrite(path, W2=W2)
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(path)


def test_non_checkpoint_npz_is_refused(tmp_path):
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(CheckpointError, match="unexpected member 'a.npy'"):
        load_checkpoint(tmp_path / "other.npz")
    np.savez(tmp_path / "weights.npz", W1=np.zeros((2, 6400)), W2=np.zeros(2))
    with pytest.raises(CheckpointError, match="not a pgpong checkpoint.*pgpong play"):
        load_checkpoint(tmp_path / "weights.npz")
    np.savez(tmp_path / "half.npz", W1=np.zeros((2, 6400)))
    with pytest.raises(CheckpointError, match="W1 and W2"):
        load_weights(tmp_path / "half.npz")


def test_pickled_object_arrays_are_never_loaded(tmp_path):
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "evil.npz", W1=np.array([object()], dtype=object), W2=np.zeros(1))
    for name in ("evil.npy", "evil.npz"):
        with pytest.raises(CheckpointError):
            load_checkpoint(tmp_path / name)


@pytest.mark.parametrize(
    "field, value",
    [
        ("batch", float("inf")),  # json writes Infinity, which Python's json reads back
        ("batch", -5),
        ("batch", 10**30),
        ("episodes", 1e300),
        ("env_steps", True),
        ("running_reward", float("nan")),
        ("wall_s", "soon"),
        ("info", [["env_id", "ALE/Pong-v5"]]),
        ("info", {"env_id": 42}),  # play would take the default environment for it
    ],
)
def test_header_counts_and_numbers_out_of_range_are_refused(tmp_path, field, value):
    path = save_checkpoint(make_state(), tmp_path)
    rewrite(path, **{field: value})
    said = "info env_id is 42" if value == {"env_id": 42} else f"{field} is"
    with pytest.raises(CheckpointError, match=f"bad header field \\({said}"):
        load_checkpoint(path)


def test_deeply_nested_header_is_refused_in_one_line(tmp_path):
    path = tmp_path / "nested.npz"
    text = "[" * 200_000 + "]" * 200_000
    np.savez(path, header=np.frombuffer(text.encode(), np.uint8), W1=np.zeros((2, 6400)), W2=np.zeros(2))
    with pytest.raises(CheckpointError, match="damaged header") as refused:
        load_checkpoint(path)
    assert "\n" not in str(refused.value)


def test_a_pipe_is_not_read_as_a_checkpoint(tmp_path):
    pipe = tmp_path / "ckpt.npz"
    os.mkfifo(pipe)  # opening it to read would wait for a writer for ever
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(pipe)


def test_an_unreadable_checkpoints_folder_is_one_error(tmp_path, monkeypatch):
    save_checkpoint(make_state(), tmp_path)

    def refused(self):  # what a folder of mode 000 answers a user who is not root
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(tmp_path), "iterdir", refused)
    with pytest.raises(CheckpointError, match="cannot list its checkpoints \\(Permission denied\\)"):
        list_checkpoints(tmp_path)
