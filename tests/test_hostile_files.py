"""Files from anywhere: hostile or broken .npz files are refused from their headers,
in one line naming the file and the problem, without reading (or unpickling, or
allocating) what the headers do not allow."""

import io
import json
import subprocess
import sys
import zipfile
import zlib
from typing import Any

import numpy as np
import pytest

from conftest import run_pgpong
from pgpong.checkpoint import MAX_HIDDEN, CheckpointError, load_weights
from test_cli import assert_one_line_error

MARKER = "pgpong-was-unpickled"


class Payload:
    """Unpickling this runs code: it would create the marker file."""

    def __init__(self, folder):
        self.folder = folder

    def __reduce__(self):
        return (open, (f"{self.folder}/{MARKER}", "w"))


def npy_header(shape, dtype="<f4") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype, "fortran_order": False, "shape": shape})
    return out.getvalue()


def zip_members(path, members: dict[str, bytes], compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        for name, data in members.items():
            z.writestr(name, data)


def good_w2(hidden=4):
    return npy_header((hidden,)) + np.zeros(hidden, np.float32).tobytes()


def bomb(path, inflated=256 * 2**20):
    """W1.npy with a proper header followed by `inflated` bytes of zeros, deflated to a
    few hundred KB: the zip directory tells the real size, the .npy header a small one."""
    header = npy_header((4, 6400))
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(2**20)
    body = [compressor.compress(header)] + [compressor.compress(chunk) for _ in range(inflated // len(chunk))]
    body.append(compressor.flush())
    data = b"".join(body)
    info = zipfile.ZipInfo("W1.npy")
    info.compress_type = zipfile.ZIP_DEFLATED
    crc = zlib.crc32(header)
    for _ in range(inflated // len(chunk)):
        crc = zlib.crc32(chunk, crc)
    with zipfile.ZipFile(path, "w") as archive:
        z: Any = archive
        z.writestr("W2.npy", good_w2())
        # Write the deflated bytes as they are: ZipFile would compress them again.
        info.CRC, info.compress_size, info.file_size = crc, len(data), len(header) + inflated
        with z._lock:  # noqa: SLF001 - zipfile has no public "raw write"
            info.header_offset = z.fp.tell()
            z.fp.write(info.FileHeader(zip64=False))
            z.fp.write(data)
            z.filelist.append(info)
            z.NameToInfo[info.filename] = info
            z.start_dir = z.fp.tell()


def build(case, folder):
    path = folder / f"{case}.npz"
    if case == "huge-shape":
        zip_members(path, {"W1.npy": npy_header((10**6, 6400)), "W2.npy": good_w2()})
    elif case == "lying-header":  # claims 4096 x 6400 float64, holds 100 bytes
        zip_members(path, {"W1.npy": npy_header((MAX_HIDDEN, 6400), "<f8") + bytes(100), "W2.npy": good_w2()})
    elif case == "bomb":
        bomb(path)
    elif case == "object-array":
        import pickle

        data = npy_header((1,), "|O") + pickle.dumps(np.array([Payload(folder)], dtype=object))
        zip_members(path, {"W1.npy": data, "W2.npy": good_w2()})
    elif case == "many-members":
        zip_members(path, {f"m{k}.npy": good_w2() for k in range(3000)})
    elif case == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(5000))
    elif case == "npy":
        path = folder / "array.npy"
        np.save(path, np.zeros((4, 6400), np.float32))
    elif case == "text":
        path = folder / "notes.npz"
        path.write_text("just some text\n" * 100)
    elif case == "int-weights":
        np.savez(path, W1=np.zeros((4, 6400), np.int64), W2=np.zeros(4, np.int64))
    elif case == "json-header-bomb":
        zip_members(path, {"header.npy": npy_header((50 * 2**20,), "|u1") + bytes(10), "W1.npy": b"", "W2.npy": b""})
    return path


CASES = {
    "huge-shape": "shape (1000000, 6400)",
    "lying-header": "promises",
    "bomb": "promises",
    "object-array": "Python objects",
    "many-members": "3000 members",
    "garbage": "not a .npz archive",
    "npy": "a single .npy array",
    "text": "not a .npz archive",
    "int-weights": "dtype int64",
    "json-header-bomb": "JSON text of at most 1 MB",
}


@pytest.mark.parametrize("case", CASES)
def test_hostile_file_is_refused_from_its_headers(tmp_path, case):
    path = build(case, tmp_path)
    with pytest.raises(CheckpointError, match=str(path.name)) as refused:
        load_weights(path)
    assert CASES[case] in str(refused.value)
    assert not (tmp_path / MARKER).exists()


PEAK = """
import resource, sys
from pathlib import Path
from pgpong.checkpoint import CheckpointError, load_weights
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_weights(Path(sys.argv[1]))
except CheckpointError:
    pass
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.parametrize("case", ["lying-header", "bomb", "huge-shape", "json-header-bomb"])
def test_refusing_a_hostile_file_allocates_little(tmp_path, case):
    path = build(case, tmp_path)
    proc = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) < 100  # MB more than the process had before it looked at the file


def test_hostile_files_through_the_command_line(tmp_path):
    for case in ("bomb", "object-array", "garbage"):
        path = build(case, tmp_path)
        proc = run_pgpong("play", str(path), "--workers", "0", timeout=60)
        assert_one_line_error(proc, path.name, CASES[case])
    (tmp_path / "dir").mkdir()
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "r"), "--resume-from", str(tmp_path / "dir"), timeout=60)
    assert proc.returncode == 2
    assert not (tmp_path / MARKER).exists()


def test_directory_given_as_a_checkpoint_suggests_run_dir(tmp_path):
    with pytest.raises(CheckpointError, match="--run-dir"):
        load_weights(tmp_path)


def test_a_good_file_still_loads(tmp_path):
    np.savez(tmp_path / "ok.npz", W1=np.ones((3, 6400), np.float64), W2=np.ones(3, np.float16))
    weights = load_weights(tmp_path / "ok.npz")
    assert weights.W1.dtype == np.float32 and weights.hidden == 3
    json.dumps({"shape": list(weights.W1.shape)})


def test_weights_beyond_float32_are_refused_not_turned_into_infinity(tmp_path):
    W1 = np.ones((3, 6400), np.float64)
    W1[1, 7] = 1e308  # finite in float64, infinity once cast to the float32 pgpong computes in
    np.savez(tmp_path / "huge.npz", W1=W1, W2=np.ones(3, np.float64))
    with pytest.raises(CheckpointError, match="beyond float32's range"):
        load_weights(tmp_path / "huge.npz")
