"""Nothing drivetrain reads from a run, a dataset or a config can hang it or make it allocate without bound
(issue 39, classes 3 and 4; docs/safety.md).

A FIFO planted where a file is read (a checkpoint's ``state.pt``, a camera JPEG, a lidar file, ``model.init_from``,
a config or its base) is refused before it is opened for reading; a small file that stands for a huge one (a YAML
alias bomb, a JPEG header declaring 30000×30000, a sparse 2 GB lidar file, a deflated ``state.pt``) is refused
from what the index and the format say before anything is allocated. Each hostile case runs the command in a
subprocess with a hard ``timeout`` (a hang fails the test instead of hanging the suite) and, for the expanding
files, under an address-space limit (``RLIMIT_AS``) far below what the expansion would take, and asserts the
exit status, the one line that names the file, no traceback, and that nothing outside the named paths changed
(a snapshot of kinds, sizes, mtimes, link targets and small files' digests, taken without reading a FIFO).

The default set runs one command of each kind through a subprocess (a FIFO as the run marker, a pickled state file
in ``eval``, a deflated state file under ``--resume auto``, a JPEG header and an inflating index under the memory
limit) beside the in-process tests of the readers and the bounded YAML loader; the other doors (FIFOs in a run, a
config, ``init_from`` and the data, the alias bomb, the shared references, the sparse lidar file) are in the slow set.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
import yaml

from drivetrain.data import DatasetConfig, FrameDataset
from drivetrain.data.dataset import Skipped
from drivetrain.data.errors import DataError
from drivetrain.data.io import MAX_POINTS, max_jpeg_bytes, read_image, read_points
from drivetrain.engine import Checkpointer, CheckpointError, Trainer, load_config
from drivetrain.engine.checkpoint import MARKER, STATE_FILE
from drivetrain.engine.config_files import (
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    BoundedSafeLoader,
    YAMLBoundError,
    load_yaml,
    read_config_file,
)
from drivetrain.engine.typed import ConfigError
from drivetrain.safeio import reads, yaml_files
from drivetrain.safeio.reads import (
    FileTooLargeError,
    NotRegularFileError,
    open_regular,
    read_bytes,
    read_text,
    zip_members_size,
)
from drivetrain.safeio.torch_files import MAX_OBJECTS, TorchFileError, _unpickling_reason, load_torch_file
from helpers.engine import ROOT, SMOKE, overrides
from helpers.refusals import drivetrain_process, one_line
from helpers.trees import tree

# A FIFO blocks a reader forever; these commands finish in 3-6 s on this 2-core machine (most of it importing
# torch), so a bound several times that tells a hang from a slow start without making the suite wait long.
HANG_S = 30
# Address space for the expanding files: a CLI process that imports torch and trains the smoke model stays under
# 1.5 GiB (measured: `train --print-config` runs at 1.5 GiB), while each bomb below would need ≥ 2.7 GB.
LIMIT_AS = 3 << 30
SMALL_LIMIT_AS = 3 << 29  # 1.5 GiB, for the commands that train nothing


# ---------------------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def deadline(seconds: float = HANG_S) -> Iterator[None]:
    """Raise TimeoutError in the block if it blocks longer than ``seconds``: an in-process read of a FIFO then fails
    the test instead of hanging the suite (Python retries an interrupted open() only after the handler returns)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s (a FIFO was opened for reading?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def drivetrain(*args: str, memory: int | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``drivetrain ARGS`` in a subprocess, killed after HANG_S seconds (a TimeoutExpired fails the test)."""
    return drivetrain_process(*args, timeout=HANG_S, memory=memory, cwd=cwd)


def commit(state: Path) -> None:
    """Write ``state``'s COMMITTED marker for its current bytes (a hostile checkpoint passes the checksum)."""
    data = state.read_bytes() if state.is_file() else b""
    marker = {"step": int(state.parent.name[5:]), "file": STATE_FILE, "size": len(data)}
    marker["sha256"] = hashlib.sha256(data).hexdigest()
    (state.parent / MARKER).write_text(json.dumps(marker))


def plant_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def deflate_bomb(state: Path, inflated: int, *, marker: bool = True) -> None:
    """Rewrite the zip archive ``state`` (a torch file, an ``.npz``) so that its largest member is deflated zeros
    declaring ``inflated`` bytes, and (``marker``) write the checkpoint's COMMITTED marker for it.

    The deflate stream is built from one compressed MiB of zeros repeated (after a full flush the compressor's
    output for the same input is the same bytes), so making a 3.5 GiB bomb costs a few MB and well under a
    second; the CRC is the true one. zipfile writes the stream as a stored member, then its central-directory
    entry — which torch's and Python's readers both go by — is rewritten to say "deflated, ``inflated`` bytes".
    Loaded by torch as it is (without the bound), such a file inflated to 3.5 GiB before torch refused it.
    """
    chunk = bytes(1 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = comp.compress(chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    blocks = inflated // len(chunk)
    stream = block * blocks + comp.flush(zlib.Z_FINISH)
    crc = 0
    for _ in range(blocks):
        crc = zlib.crc32(chunk, crc)
    with zipfile.ZipFile(state) as src:
        members = [(info, src.read(info)) for info in src.infolist()]
    target = max(members, key=lambda member: member[0].file_size)[0].filename
    rewritten = state.with_name("rewritten.pt")
    with zipfile.ZipFile(rewritten, "w", zipfile.ZIP_STORED) as dst:
        for info, data in members:
            dst.writestr(info, stream if info.filename == target else data)
        bomb = dst.getinfo(target)
        bomb.compress_type, bomb.file_size, bomb.CRC = zipfile.ZIP_DEFLATED, blocks * len(chunk), crc
    rewritten.replace(state)
    if marker:
        commit(state)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smoke run of 4 steps with committed checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("reads-run") / "run"
    Trainer(load_config(SMOKE, overrides(out, "train.steps=4", "checkpoint.every=2"))).fit()
    return out


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained run, beside a neighbour folder that nothing may touch."""
    (tmp_path / "neighbour").mkdir()
    (tmp_path / "neighbour" / "notes.txt").write_text("someone else's file\n")
    return Path(shutil.copytree(trained, tmp_path / "run"))


def resume_auto(run: Path, memory: int | None = None) -> subprocess.CompletedProcess:
    args = overrides(run, "train.steps=6", "checkpoint.every=2")
    return drivetrain("train", "--config", str(SMOKE), *args, "--resume", "auto", memory=memory)


def assert_fell_back(proc: subprocess.CompletedProcess, run: Path, bad: Path, reason: str) -> None:
    """``--resume auto`` skipped the bad newest checkpoint (a warning naming its state file and ``reason``), moved
    it to ``checkpoints/corrupt/`` untouched, resumed from step 2 and trained on."""
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    skipped = [line for line in proc.stderr.splitlines() if line.startswith("drivetrain: CheckpointWarning: skipping")]
    assert len(skipped) == 1 and f"{bad}: " in skipped[0] and reason in skipped[0], proc.stderr
    assert f"resumed from {run / 'checkpoints' / 'step-00000002'} at step 2" in proc.stderr
    assert [s for s, _ in Checkpointer(run / "checkpoints").committed()] == [4, 6]  # step 4 written again
    assert (run / "checkpoints" / "corrupt" / "step-00000004").is_dir()


# ---------------------------------------------------------------------------------------------- the helpers
def test_special_files_are_refused_before_they_are_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    (tmp_path / "file").write_bytes(b"12345")
    for path in (fifo, tmp_path / "link", tmp_path, Path("/dev/null")):
        for read in (read_bytes, read_text, open_regular, zip_members_size):
            with deadline(), pytest.raises(NotRegularFileError) as err:
                read(path)
            assert str(err.value).endswith(", not a regular file") and err.value.filename == str(path)
    with deadline(), pytest.raises(NotRegularFileError, match=r"^a FIFO \(named pipe\), not a regular file$"):
        read_bytes(fifo)
    assert read_bytes(tmp_path / "file", limit=5) == b"12345"
    with pytest.raises(FileTooLargeError, match=r"^5 bytes, more than the 4 bytes a test allows$"):
        read_bytes(tmp_path / "file", limit=4, what="a test allows")
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "absent")


def test_a_fifo_swapped_in_after_the_check_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second layer: with the stat check passed (as if the FIFO appeared just after it), the open does not
    block (O_NONBLOCK) and the opened file's fstat refuses it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(reads, "regular_stat", lambda path, **kwargs: None)
    with deadline(), pytest.raises(NotRegularFileError, match=r"^a FIFO \(named pipe\), not a regular file$"):
        read_bytes(fifo)


def test_a_torch_save_archive_declares_no_more_than_its_size(tmp_path: Path) -> None:
    """The checkpoint bound holds for what torch.save writes: members stored, declared total < file size (for
    an empty dict, scalars, many small tensors, a large one and a real run's checkpoint state)."""
    states = {
        "empty": {},
        "scalars": {"a": 1, "b": [1.5, "x"], "c": torch.tensor(3)},
        "many": {f"t{i}": torch.randn(i % 7) for i in range(300)},
        "large": {"w": torch.zeros(1 << 20)},
    }
    for name, state in states.items():
        path = tmp_path / f"{name}.pt"
        torch.save(state, path)
        declared, stored = zip_members_size(path)
        assert stored and declared < path.stat().st_size, name
        loaded = load_torch_file(path)
        assert loaded.keys() == state.keys()


def test_pickled_objects_are_named_in_our_words_whatever_torch_says(tmp_path: Path) -> None:
    """A refused pickle is told by the exception's type and the file's format, never by torch's wording: the line
    names the object and never carries torch's advice to set weights_only=False."""

    class Payload:
        def __reduce__(self):  # what a hostile file holds: a call of os.system when unpickled
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    torch.save({"w": torch.zeros(2), "x": Payload()}, tmp_path / "system.pt")
    torch.save({"w": torch.zeros(2), "x": len}, tmp_path / "builtin.pt")
    (tmp_path / "text.pt").write_text("not weights")
    cases = {"system.pt": "it needs posix.system", "builtin.pt": "it needs builtins.len"}
    for name, needs in cases.items():
        with pytest.raises(TorchFileError) as err:
            load_torch_file(tmp_path / name)
        line = one_line(str(err.value))
        assert line.startswith(f"holds pickled Python objects ({needs}), which are never loaded"), line
        assert "weights_only=False" not in line and "Weights only load failed" not in line
        message = pickle.UnpicklingError("a future torch says something else entirely")
        with open(tmp_path / name, "rb") as f:  # without torch's words: the archive's own globals name it
            assert _unpickling_reason(f, True, message).startswith(f"holds pickled Python objects ({needs})")
    with pytest.raises(TorchFileError, match=r"^not a torch.save archive"):
        load_torch_file(tmp_path / "text.pt")
    with pytest.raises(TorchFileError, match=r"^not a PyTorch weights file \(neither a zip archive nor a pickle\)"):
        load_torch_file(tmp_path / "text.pt", legacy=True)
    assert not (tmp_path / "ran").exists()


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.slow  # ~3 s; a FIFO refused: the run marker's test
def test_resume_auto_moves_a_fifo_state_file_aside_and_resumes_from_the_previous_checkpoint(
    run: Path, tmp_path: Path
) -> None:
    state = run / "checkpoints" / "step-00000004" / STATE_FILE
    plant_fifo(state)
    commit(state)  # the marker agrees (0 bytes, the empty SHA-256): only the file's kind gives it away
    neighbour = tree(tmp_path / "neighbour")
    proc = resume_auto(run)
    assert_fell_back(proc, run, state, "unreadable state file (a FIFO (named pipe), not a regular file)")
    moved = run / "checkpoints" / "corrupt" / "step-00000004" / STATE_FILE
    assert stat.S_ISFIFO(moved.lstat().st_mode)  # moved aside as it was, never opened or deleted
    assert tree(tmp_path / "neighbour") == neighbour


def test_resume_auto_refuses_a_deflated_state_file_before_inflating_it_and_falls_back(
    run: Path, tmp_path: Path
) -> None:
    state = run / "checkpoints" / "step-00000004" / STATE_FILE
    deflate_bomb(state, 7 << 29)  # 3.5 GiB declared in a 3.6 MiB file; the process may use 3 GiB in all
    assert state.stat().st_size < 4 << 20
    neighbour = tree(tmp_path / "neighbour")
    proc = resume_auto(run, memory=LIMIT_AS)
    assert_fell_back(proc, run, state, "its members declare 3.5 GiB uncompressed, more than the file's 3.6 MiB")
    assert tree(tmp_path / "neighbour") == neighbour
    with pytest.raises(CheckpointError, match="refused before loading"):  # the same for eval, predict, viz, init_from
        Checkpointer(state.parent.parent).load(run / "checkpoints" / "corrupt" / "step-00000004")


@pytest.mark.slow  # ~4 s; a resume falling back: the deflated state file's test
def test_resume_auto_refuses_a_state_file_whose_shared_references_expand_and_falls_back(
    run: Path, tmp_path: Path
) -> None:
    """A pickle's memo lets a 100 KB state.pt hold nine references to a list of nine references to ... (9⁹ items
    once copied): the YAML alias bomb in pickle form, which the resume's config comparison would expand."""
    state_path = run / "checkpoints" / "step-00000004" / STATE_FILE
    state = torch.load(state_path, weights_only=True)
    bomb: list = ["lol"] * 9
    for _ in range(8):
        bomb = [bomb] * 9
    state["config"]["model"]["args"]["bomb"] = bomb
    torch.save(state, state_path)
    commit(state_path)
    assert state_path.stat().st_size < 1 << 20
    neighbour = tree(tmp_path / "neighbour")
    proc = resume_auto(run, memory=LIMIT_AS)
    assert_fell_back(proc, run, state_path, f"its containers expand to more than {MAX_OBJECTS} objects through shared")
    assert tree(tmp_path / "neighbour") == neighbour


def test_a_fifo_as_the_run_marker_is_one_line(run: Path, tmp_path: Path) -> None:
    plant_fifo(run / ".drivetrain-run")
    before = tree(tmp_path)
    proc = resume_auto(run)
    assert proc.returncode == 2
    assert one_line(proc.stderr) == (
        f"drivetrain train: config error: run.out_dir: {run / '.drivetrain-run'} is not a drivetrain run marker (a "
        "FIFO (named pipe), not a regular file)"
    )
    assert tree(tmp_path) == before


@pytest.mark.parametrize("command", ["eval", pytest.param("viz", marks=pytest.mark.slow)])  # viz: ~3 s, the same load
def test_a_pickled_state_file_is_one_line_of_ours_in_eval_and_viz(run: Path, tmp_path: Path, command: str) -> None:
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    ckpt = run / "checkpoints" / "step-00000004"
    state = torch.load(ckpt / STATE_FILE, weights_only=True)
    state["train"] = Payload()
    torch.save(state, ckpt / STATE_FILE)
    commit(ckpt / STATE_FILE)
    before = tree(tmp_path)
    args = ["eval", "--checkpoint", str(ckpt)] if command == "eval" else ["viz", "frame", "--checkpoint", str(ckpt)]
    proc = drivetrain(*args, "--frame", "0") if command == "viz" else drivetrain(*args)
    assert proc.returncode == 1, proc.stderr
    line = one_line(proc.stderr)
    assert f"{ckpt / STATE_FILE}: holds pickled Python objects (it needs posix.system), which are never loaded" in line
    assert "weights_only=False" not in line and "Weights only" not in line
    assert tree(tmp_path) == before and not (tmp_path / "ran").exists()


@pytest.mark.slow  # ~9 s; a FIFO refused: the run marker's test
def test_report_and_doctor_do_not_block_on_fifos_in_a_run(run: Path, tmp_path: Path) -> None:
    plant_fifo(run / "checkpoints" / "step-00000004" / STATE_FILE)
    plant_fifo(run / "checkpoints" / "step-00000002" / STATE_FILE)
    proc = drivetrain("report", str(run), "--out", str(tmp_path / "report"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr  # the versions are just unknown
    assert (tmp_path / "report" / "report.md").is_file()
    plant_fifo(run / "config.yaml")
    before = tree(tmp_path)
    proc = drivetrain("doctor", str(run), "--no-profile")
    assert proc.returncode == 1
    assert one_line(proc.stderr) == (
        f"doctor: {run / 'config.yaml'}: cannot read the config (a FIFO (named pipe), not a regular file)"
    )
    assert tree(tmp_path) == before  # no doctor.md / doctor.json
    plant_fifo(run / "metrics.jsonl")
    before = tree(tmp_path)
    for args in (["doctor", str(run), "--no-profile"], ["report", str(run), "--out", str(tmp_path / "report")]):
        proc = drivetrain(*args)
        assert proc.returncode == 1
        line = one_line(proc.stderr)
        assert line.endswith(f"{run / 'metrics.jsonl'}: cannot be read (a FIFO (named pipe), not a regular file)")
    assert tree(tmp_path) == before


@pytest.mark.slow  # ~3 s; a FIFO refused: the run marker's test
def test_a_fifo_as_init_from_is_one_line_before_the_run_directory_is_made(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "weights.pt")
    before = tree(tmp_path)
    proc = drivetrain(
        "train", "--config", str(SMOKE), *overrides(tmp_path / "run", f"model.init_from={tmp_path}/weights.pt")
    )
    assert proc.returncode == 2
    assert one_line(proc.stderr) == (
        f"drivetrain train: config error: model.init_from: {tmp_path / 'weights.pt'}: cannot be read (a FIFO (named "
        "pipe), not a regular file)"
    )
    assert tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------- configs
@pytest.mark.slow  # ~6 s; a FIFO refused: the run marker's test
def test_a_fifo_as_a_config_or_its_base_is_one_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "child.yaml").write_text("base: fifo.yaml\n")
    before = tree(tmp_path)
    for config, where in (("fifo.yaml", "fifo.yaml"), ("child.yaml", "fifo.yaml (the base of child.yaml)")):
        proc = drivetrain("train", "--config", config, "--print-config", cwd=tmp_path)
        assert proc.returncode == 2
        assert one_line(proc.stderr) == (
            f"drivetrain train: config error: {where}: cannot read the config (a FIFO (named pipe), not a regular file)"
        )
    assert tree(tmp_path) == before


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs document: each level a list of ``width`` aliases of the level before (9⁹ ≈ 387M nodes)."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.slow  # ~8 s; the alias count: the bounded loader's tests below; a memory limit: the deflated files' tests
def test_a_yaml_alias_bomb_is_refused_while_parsed_under_a_memory_limit(run: Path, tmp_path: Path) -> None:
    bomb = _alias_bomb()
    assert len(bomb) < 600  # the was 595 bytes
    (tmp_path / "bomb.yaml").write_text(bomb)
    (tmp_path / "child.yaml").write_text("base: bomb.yaml\n")
    before = tree(tmp_path)
    for config in ("bomb.yaml", "child.yaml"):
        proc = drivetrain("train", "--config", config, "--print-config", memory=SMALL_LIMIT_AS, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        line = one_line(proc.stderr)
        assert f"bomb.yaml{'' if config == 'bomb.yaml' else ' (the base of child.yaml)'}: refused: the YAML " in line
        assert f"expands to more than {MAX_YAML_NODES} nodes through its aliases (line 6, column " in line
    (run / "config.yaml").write_text(bomb)
    before_run = tree(run)
    proc = drivetrain("doctor", str(run), "--no-profile", memory=SMALL_LIMIT_AS)
    assert proc.returncode == 1, proc.stderr
    assert one_line(proc.stderr).startswith(f"doctor: {run / 'config.yaml'}: refused: the YAML expands to more than")
    assert tree(run) == before_run  # no doctor.md/doctor.json written
    assert {k: v for k, v in tree(tmp_path).items() if not k.startswith("run")} == {
        k: v for k, v in before.items() if not k.startswith("run")
    }


def test_the_bounded_loader_reads_every_shipped_config_as_safe_load_does() -> None:
    for path in sorted([*(ROOT / "configs").glob("*.yaml"), *(ROOT / "configs").glob("*/*.yaml")]):
        text = path.read_text()
        assert load_yaml(text) == yaml.safe_load(text), path


def test_the_bounded_loader_counts_aliases_as_the_copies_they_make(monkeypatch: pytest.MonkeyPatch) -> None:
    """Aliases and merge keys within the bounds load as with safe_load; the bounds are exact (the root counts as
    one node of depth one; the node bound is lowered to 1000 to keep the pure-Python parse short), and a document
    that contains itself is refused."""
    text = "base: &b {lr: 1, betas: [0.9, 0.99]}\nother:\n  <<: *b\n  lr: 2\nagain: *b\n"
    assert load_yaml(text) == yaml.safe_load(text)
    monkeypatch.setattr(yaml_files, "MAX_YAML_NODES", 1000)
    flat = "[" + ", ".join(["1"] * 999) + "]"  # the list and its items: exactly the bound
    assert len(load_yaml(flat)) == 999
    with pytest.raises(YAMLBoundError, match="expands to more than 1000 nodes"):
        load_yaml(flat[:-1] + ", 1]")

    def aliases(n: int) -> str:  # a list of 9 items (10 nodes) and n aliases of it: the root counts 13 + 10 n
        return "a: &a [" + ", ".join(["1"] * 9) + "]\nb: [" + ", ".join(["*a"] * n) + "]\n"

    assert len(load_yaml(aliases(98))["b"]) == 98  # 993 nodes once copied
    with pytest.raises(YAMLBoundError, match="expands to more than 1000 nodes"):
        load_yaml(aliases(99))  # 1003
    assert load_yaml("[" * (MAX_YAML_DEPTH - 1) + "1" + "]" * (MAX_YAML_DEPTH - 1)) is not None
    with pytest.raises(YAMLBoundError, match=f"nested deeper than {MAX_YAML_DEPTH} levels"):
        load_yaml("[" * MAX_YAML_DEPTH + "1" + "]" * MAX_YAML_DEPTH)
    deep = "a: &a " + "[" * 60 + "1" + "]" * 60 + "\nb: " + "[" * 45 + "*a" + "]" * 45 + "\n"
    with pytest.raises(YAMLBoundError, match="through its aliases"):  # 1 + 45 + 61 > 100 once the alias is copied
        load_yaml(deep)
    with pytest.raises(YAMLBoundError, match="an alias of a node that contains it"):
        load_yaml("a: &a [1, *a]\n")
    assert issubclass(BoundedSafeLoader, yaml.SafeLoader)
    with pytest.raises(yaml.constructor.ConstructorError):  # still no Python objects
        load_yaml("!!python/object/apply:os.system ['true']")


def test_a_base_linked_to_a_foreign_file_is_named_without_quoting_it(tmp_path: Path) -> None:
    secret = "def f(a): return {'password': 'hunter2'}\n"
    (tmp_path / "secret.py").write_text("import os\nos.system('x')\n" + secret)
    (tmp_path / "key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n-----END\n")
    (tmp_path / "code.yaml").symlink_to(tmp_path / "secret.py")
    (tmp_path / "key.yaml").symlink_to(tmp_path / "key")
    (tmp_path / "a.yaml").write_text("base: code.yaml\n")
    (tmp_path / "b.yaml").write_text("base: key.yaml\n")
    with pytest.raises(ConfigError) as err:
        read_config_file(tmp_path / "a.yaml")
    line = one_line(str(err.value))
    assert line == (
        f"{tmp_path / 'code.yaml'} (the base of {tmp_path / 'a.yaml'}): not valid YAML: mapping values are not allowed "
        f"here (line 3, column 9); it is a link to {tmp_path / 'secret.py'}, which is no YAML config"
    )
    with pytest.raises(ConfigError) as err:
        read_config_file(tmp_path / "b.yaml")
    line = one_line(str(err.value))
    assert line.endswith(f"expected a mapping at the top level, got str ({tmp_path / 'key.yaml'} is a link to "
                         f"{tmp_path / 'key'})")  # fmt: skip
    for text in ("hunter2", "password", "os.system", "BEGIN", "b3Bl"):
        assert text not in line


# ---------------------------------------------------------------------------------------------- datasets
@pytest.fixture
def data(synth_root: Path, synth_index, tmp_path: Path) -> Path:
    """A private copy of the session's synthetic dataset (with its index), to plant files in."""
    return Path(shutil.copytree(synth_root, tmp_path / "data", symlinks=True))


def _first(data: Path, channel: str) -> Path:
    return sorted((data / "samples" / channel).iterdir())[0]


@pytest.mark.slow  # ~4 s; a FIFO refused: the run marker's test
def test_a_fifo_as_a_camera_image_or_lidar_file_is_one_line_naming_it(data: Path, tmp_path: Path) -> None:
    image, lidar = _first(data, "CAM_FRONT"), _first(data, "LIDAR_TOP")
    plant_fifo(image)
    plant_fifo(lidar)
    before = tree(tmp_path)
    proc = drivetrain("data", "inspect", "--index", str(data / "drivetrain_index.npz"), "--split", "mini_train")
    assert proc.returncode == 1
    assert one_line(proc.stderr) == (
        f"data inspect: {image}: cannot read image (a FIFO (named pipe), not a regular file)"
    )
    proc = drivetrain("viz", "frame", "--root", str(data), "--split", "mini_train", "--frame", "0", "--no-cameras",
                      "--png", str(tmp_path / "frame.png"))  # fmt: skip
    assert proc.returncode == 1
    line = one_line(proc.stderr)
    assert line == f"viz frame: --frame 0: {lidar}: cannot read lidar file (a FIFO (named pipe), not a regular file)"
    assert tree(tmp_path) == before  # no frame.png
    frames = FrameDataset(data / "drivetrain_index.npz", DatasetConfig(load_points=True, on_error="skip"))
    with deadline(), pytest.warns(RuntimeWarning, match=f"skipping frame 0: {image}: cannot read image \\(a FIFO"):
        assert isinstance(frames[0], Skipped)  # the loader's skip path: warned about, dropped and counted


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A valid 16×16 JPEG whose start-of-frame header is rewritten to declare ``width × height`` (634 bytes)."""
    data = bytearray(simplejpeg.encode_jpeg(np.zeros((16, 16, 3), np.uint8), quality=90, colorspace="RGB"))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def test_a_jpeg_declaring_30000x30000_is_refused_from_its_header_before_decoding(data: Path, tmp_path: Path) -> None:
    image = _first(data, "CAM_FRONT")
    image.write_bytes(_jpeg_declaring(30000, 30000))  # decoded, 2.7 GB; the process may use 1.5 GiB in all
    assert len(image.read_bytes()) < 1000
    before = tree(tmp_path)
    index = str(data / "drivetrain_index.npz")
    proc = drivetrain("data", "inspect", "--index", index, "--split", "mini_train", memory=SMALL_LIMIT_AS)
    assert proc.returncode == 1, proc.stderr
    assert one_line(proc.stderr) == f"data inspect: {image}: image is 30000×30000, the index says 160×90"
    assert tree(tmp_path) == before
    with pytest.raises(DataError, match="image is 30000×30000, more than the"):  # no index record: the pixel bound
        read_image(image)
    image.write_bytes(b"\xff\xd8" + bytes(max_jpeg_bytes(160, 90)))  # larger than any 160×90 JPEG may be
    with pytest.raises(DataError, match=r"cannot read image \(.* more than the .* a 160×90 JPEG may hold\)$"):
        read_image(image, (160, 90))


@pytest.mark.slow  # ~3 s; a file refused from its size under a memory limit: the JPEG header's and the index's tests
def test_a_sparse_2gb_lidar_file_is_refused_from_its_size_before_reading(data: Path, tmp_path: Path) -> None:
    lidar = _first(data, "LIDAR_TOP")
    os.truncate(lidar, (2 << 30) - 8)  # sparse, whole 20-byte points: read, 2 GiB, then 10.7 GB merged and copied
    assert lidar.stat().st_blocks * 512 < 1 << 20
    before = tree(tmp_path)
    proc = drivetrain("viz", "frame", "--root", str(data), "--split", "mini_train", "--frame", "0", "--no-cameras",
                      "--png", str(tmp_path / "frame.png"), memory=SMALL_LIMIT_AS)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith("viz frame: --frame 0: ") and line.endswith(
        f"{lidar}: cannot read lidar file (2.0 GiB, more than the 80.0 MiB {MAX_POINTS} points may hold)"
    ), line
    assert tree(tmp_path) == before
    os.truncate(lidar, MAX_POINTS * 20)  # the bound itself is read
    assert read_points(lidar).shape == (MAX_POINTS, 5)


def test_an_index_whose_arrays_inflate_is_refused_before_np_load(data: Path, tmp_path: Path) -> None:
    index = data / "drivetrain_index.npz"
    deflate_bomb(index, 7 << 29, marker=False)  # 3.5 GiB declared; the process may use 1.5 GiB in all
    before = tree(tmp_path)
    proc = drivetrain("data", "inspect", "--index", str(index), memory=SMALL_LIMIT_AS)
    assert proc.returncode == 1, proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith(f"data inspect: {index}: its arrays declare 3.5 GiB uncompressed, more than the file's "), (
        line
    )
    assert tree(tmp_path) == before


def test_a_sweep_cache_shard_whose_arrays_inflate_is_refused(synth_root: Path, synth_index, tmp_path: Path) -> None:
    from drivetrain.data.sweep_cache import build_cache
    from drivetrain.data.sweeps import SweepConfig

    config = SweepConfig(num_sweeps=1)
    out = tmp_path / "cache"
    build_cache(synth_index, synth_root, out, config, read_points, frames_per_shard=5)
    shard = out / "shard-00000.npz"
    deflate_bomb(shard, 1 << 30, marker=False)  # 1 GiB declared in ~1 MB
    manifest = json.loads((out / "manifest.json").read_text())  # the size the cache checks on opening: the bomb's
    manifest["shards"][0]["files"][shard.name]["bytes"] = shard.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest))
    frames = FrameDataset(
        synth_root / "drivetrain_index.npz",
        DatasetConfig(load_images=False, load_points=True, num_sweeps=1, sweep_cache=str(out)),
    )
    with pytest.raises(
        DataError, match=r"shard-00000\.npz: unreadable sweep-cache shard \(ValueError: its arrays declare"
    ):
        frames[0]
