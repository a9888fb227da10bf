"""Checkpoints: atomic, versioned, checksummed .npz files that never need pickle.

A checkpoint holds the weights under the names W1 (H, 6400) and W2 (H,), the
RMSProp cache, and a JSON header (counters, running reward, learning settings).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pgpong.config import MAX_HIDDEN
from pgpong.errors import PgpongError
from pgpong.files import open_regular
from pgpong.frames import D
from pgpong.policy import Params

FORMAT = "pgpong-checkpoint"
VERSION = 1
ARRAYS = ("W1", "W2", "cache_W1", "cache_W2")
LAGGED = ("previous_W1", "previous_W2")  # with --lag 1: the weights from before the last update
_NAME = re.compile(r"^ckpt-(\d{6,})\.npz$")


class CheckpointError(PgpongError, ValueError):
    """A file is not a usable checkpoint; the message names the file and the problem."""


@dataclass
class TrainingState:
    """Everything needed to continue a run exactly where it stopped."""

    weights: Params
    cache: Params
    batch: int = 0  # batches completed
    episodes: int = 0
    env_steps: int = 0
    running_reward: float | None = None
    wall_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)  # settings the run was made with
    previous: Params | None = None  # with --lag 1: the weights before the last update, which the next batch plays


def checkpoint_bytes(hidden: int) -> int:
    """About how large one checkpoint of a network with `hidden` units is."""
    return 2 * 4 * hidden * (D + 1) + 64 * 1024


def remove_stale_temporaries(directory: Path) -> None:
    """Delete temp files a killed writer left behind (never a finished checkpoint)."""
    if directory.is_dir():
        for tmp in directory.glob(".ckpt-*.tmp"):
            tmp.unlink(missing_ok=True)


def checkpoint_path(directory: Path, batch: int) -> Path:
    return directory / f"ckpt-{batch:06d}.npz"


def save_checkpoint(state: TrainingState, directory: Path, keep: int = 3) -> Path:
    """Write atomically (temp file, fsync, rename), then prune to the newest `keep`."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {
        "W1": state.weights.W1,
        "W2": state.weights.W2,
        "cache_W1": state.cache.W1,
        "cache_W2": state.cache.W2,
    }
    if state.previous is not None:
        arrays |= {"previous_W1": state.previous.W1, "previous_W2": state.previous.W2}
    header = {
        "format": FORMAT,
        "version": VERSION,
        "batch": state.batch,
        "episodes": state.episodes,
        "env_steps": state.env_steps,
        "running_reward": state.running_reward,
        "wall_s": state.wall_s,
        "info": state.info,
        "sha256": _digest(arrays),
    }
    path = checkpoint_path(directory, state.batch)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # The archive is built in memory (about 10 MB at 200 hidden units) and written in one
    # go: a full disk is then a plain OSError from write(), never an error inside zipfile
    # (which, with some numpy releases, raises ValueError over it and again when collected).
    members: dict[str, Any] = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays}
    archive = io.BytesIO()
    np.savez(archive, **members)
    try:
        with open(tmp, "wb") as f:
            f.write(archive.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(directory)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path) -> TrainingState:
    """Read and verify a checkpoint; raise CheckpointError saying what is wrong."""
    arrays, header = _read(path)
    if header.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a pgpong checkpoint (no pgpong header)")
    if header.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {header.get('version')!r}, this pgpong reads version {VERSION}"
        )
    missing = [name for name in ARRAYS if name not in arrays]
    if missing:
        raise CheckpointError(f"{path}: missing arrays {', '.join(missing)}")
    if sum(name in arrays for name in LAGGED) == 1:
        raise CheckpointError(f"{path}: one of {' and '.join(LAGGED)} without the other")
    if _digest(arrays) != header.get("sha256"):
        raise CheckpointError(f"{path}: checksum mismatch, the file is corrupted")
    weights = _checked_params(path, arrays["W1"], arrays["W2"])
    cache = _checked_params(path, arrays["cache_W1"], arrays["cache_W2"])
    if cache.W1.shape != weights.W1.shape:
        raise CheckpointError(f"{path}: RMSProp cache shape {cache.W1.shape} differs from W1 {weights.W1.shape}")
    previous = None
    if any(name in arrays for name in LAGGED):
        previous = _checked_params(path, arrays["previous_W1"], arrays["previous_W2"])
        if previous.W1.shape != weights.W1.shape:
            raise CheckpointError(f"{path}: previous_W1 shape {previous.W1.shape} differs from W1 {weights.W1.shape}")
    try:
        running_reward = header["running_reward"]
        return TrainingState(
            weights=weights,
            cache=cache,
            batch=_count(header, "batch"),
            episodes=_count(header, "episodes"),
            env_steps=_count(header, "env_steps"),
            running_reward=None if running_reward is None else _finite(running_reward, "running_reward"),
            wall_s=_finite(header["wall_s"], "wall_s"),
            info=_info(header),
            previous=previous,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CheckpointError(f"{path}: bad header field ({exc})") from None


MAX_COUNT = 2**53  # batches, episodes and env steps: far beyond any run, exact in a float


def _count(header: dict[str, Any], name: str) -> int:
    value = header[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{name} is {value!r}, not a whole number from 0 to 2**53")
    return value


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} is {value!r}, not a finite number")
    return float(value)


def _info(header: dict[str, Any]) -> dict[str, Any]:
    info = header.get("info", {})
    if not isinstance(info, dict):
        raise ValueError(f"info is {type(info).__name__}, not the run's settings")
    env_id = info.get("env_id")
    if env_id is not None and not isinstance(env_id, str):
        raise ValueError(f"info env_id is {env_id!r}, not an environment's name")
    return dict(info)


def load_weights(path: Path) -> Params:
    """The policy weights of a pgpong checkpoint, or of any .npz with W1 (H, 6400) and W2 (H,)."""
    return read_weights(path)[0]


def read_weights(path: Path) -> tuple[Params, dict[str, Any]]:
    """The policy weights of a checkpoint or weights file, and the settings its run
    recorded ({} for a file with W1 and W2 only)."""
    arrays, header = _read(path, need_header=False)
    if header:
        state = load_checkpoint(path)
        return state.weights, state.info
    if "W1" not in arrays or "W2" not in arrays:
        raise CheckpointError(f"{path}: no arrays named W1 and W2")
    return _checked_params(path, arrays["W1"], arrays["W2"]), {}


def described(path: Path) -> str:
    """A checkpoint's name for a picture's title: 'run NAME, batch N' for a run's own, else the file's name."""
    path = Path(os.path.abspath(path))  # (a symbolic link's own name kept)
    found = _NAME.match(path.name)
    if found is None or path.parent.name != "checkpoints":
        return path.name
    return f"run {path.parent.parent.name or path.parent.parent}, batch {int(found.group(1)):,}"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint files in `directory`, oldest first."""
    try:
        if not directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    except OSError as exc:
        raise CheckpointError(f"{directory}: cannot list its checkpoints ({exc.strerror or exc})") from None
    return [p for _, p in sorted(found)]


MAX_HEADER_BYTES = 1 << 20
_MEMBERS = {"header": MAX_HEADER_BYTES, **dict.fromkeys(ARRAYS + LAGGED)}


def _read(path: Path, need_header: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and JSON header of a checkpoint or weights file, read only after the
    zip directory and every member's .npy header were checked: expected names only,
    float arrays of usable shapes (or the uint8 header), sizes that agree. Nothing is
    ever unpickled, and no array larger than its header allows is allocated."""
    _check_kind(path)
    try:
        with open_regular(path, binary=True) as f, zipfile.ZipFile(f) as archive:
            shapes = _checked_members(path, archive)
            arrays = {}
            for name, (info, _shape) in shapes.items():
                with archive.open(info) as member:
                    arrays[name] = np.lib.format.read_array(member, allow_pickle=False)
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except zipfile.BadZipFile as exc:
        kind = "a single .npy array" if _starts_with(path, b"\x93NUMPY") else "not a .npz archive"
        raise CheckpointError(f"{path}: {kind}, or truncated or damaged ({exc})") from None
    except (EOFError, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: truncated or damaged file ({exc or type(exc).__name__})") from None
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a readable .npz file ({_one_line(exc)})") from None
    raw = arrays.pop("header", None)
    if raw is None:
        if need_header:
            raise CheckpointError(
                f"{path}: not a pgpong checkpoint (no pgpong header): a weights-only file is for `pgpong play`"
            )
        return arrays, {}
    try:
        header = json.loads(raw.tobytes().decode())
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}: damaged header ({_one_line(exc)})") from None
    return arrays, header


def _check_kind(path: Path) -> None:
    with contextlib.suppress(OSError):  # (opening it says why)
        if path.is_dir():
            raise CheckpointError(f"{path}: is a directory (to continue a run, give it as --run-dir)")


def _checked_members(path: Path, archive: zipfile.ZipFile) -> dict[str, tuple[zipfile.ZipInfo, tuple[int, ...]]]:
    infos = archive.infolist()
    if len(infos) > len(_MEMBERS):
        raise CheckpointError(f"{path}: {len(infos)} members; a pgpong file has at most {len(_MEMBERS)}")
    checked = {}
    for info in infos:
        name = info.filename.removesuffix(".npy")
        if name not in _MEMBERS or not info.filename.endswith(".npy"):
            raise CheckpointError(f"{path}: unexpected member {info.filename!r} (expected W1, W2 and pgpong's own)")
        with archive.open(info) as member:
            try:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(member, max_header_size=10_000)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(member, max_header_size=10_000)
            except (ValueError, EOFError, zipfile.BadZipFile) as exc:
                raise CheckpointError(
                    f"{path}: member {info.filename} has no valid .npy header ({_one_line(exc)})"
                ) from None
            offset = member.tell()
        _check_member(path, name, shape, dtype)
        expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if info.file_size != expected:
            raise CheckpointError(
                f"{path}: member {info.filename} holds {info.file_size} bytes, its header promises {expected}"
            )
        checked[name] = (info, tuple(shape))
    return checked


def _check_member(path: Path, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if dtype.hasobject:
        raise CheckpointError(f"{path}: member {name} holds Python objects; pgpong never unpickles")
    if name == "header":
        if dtype != np.uint8 or len(shape) != 1 or shape[0] > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path}: member header is not a JSON text of at most 1 MB")
        return
    if dtype.kind != "f" or dtype.itemsize > 8:
        raise CheckpointError(f"{path}: {name} has dtype {dtype}; pgpong reads float16, float32 or float64 weights")
    hidden_ok = len(shape) >= 1 and 1 <= shape[0] <= MAX_HIDDEN
    if name.endswith("W1"):
        ok = hidden_ok and len(shape) == 2 and shape[1] == D
    else:
        ok = hidden_ok and len(shape) == 1
    if not ok:
        what = f"(H, {D})" if name.endswith("W1") else "(H,)"
        raise CheckpointError(f"{path}: {name} has shape {shape}; expected {what} with H from 1 to {MAX_HIDDEN}")


def _starts_with(path: Path, prefix: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(prefix)) == prefix
    except OSError:
        return False


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _checked_params(path: Path, W1: np.ndarray, W2: np.ndarray) -> Params:
    if W1.ndim != 2 or W1.shape[1] != D or W2.shape != (W1.shape[0],):
        raise CheckpointError(f"{path}: wrong shapes W1 {W1.shape}, W2 {W2.shape}; expected (H, {D}) and (H,)")
    if not (np.issubdtype(W1.dtype, np.floating) and np.issubdtype(W2.dtype, np.floating)):
        raise CheckpointError(f"{path}: W1 and W2 must be floating point, got {W1.dtype} and {W2.dtype}")
    if not (np.isfinite(W1).all() and np.isfinite(W2).all()):
        raise CheckpointError(f"{path}: weights contain NaN or infinity")
    with np.errstate(over="ignore"):
        params = Params.of(W1, W2)  # float32: a finite float64 beyond its range becomes infinity
    if not (np.isfinite(params.W1).all() and np.isfinite(params.W2).all()):
        raise CheckpointError(f"{path}: weights beyond float32's range (about 3.4e38), as pgpong computes in float32")
    return params


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in ARRAYS + tuple(n for n in LAGGED if n in arrays):  # a checkpoint without a lag: as before
        a = arrays[name]
        h.update(f"{name}{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).data)  # read in place (a copy only for a Fortran-order W1)
    return h.hexdigest()


def fsync_file(path: Path) -> None:
    """Make a file written earlier durable (if it exists)."""
    if path.exists():
        with open(path, "ab") as f:  # (Windows refuses an fsync on a file opened to read)
            os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries durable (where the system allows: not on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
