"""Hostile values become one line, not a traceback, and the current folder is not imported from (issue 39, classes 5
and 6; docs/safety.md).

- JSON nested 100,000 deep (200 KB) in a table, a predictions file or a ``metrics.jsonl`` line, and an integer such
  as ``10**4000``, are refused by :mod:`drivetrain.safeio.json_files` (every untrusted JSON read goes through it) in one
  line naming the file, the line of a jsonl file and the place (``[0].translation[0]``): ``data index``, ``eval
  --predictions``, ``report`` and ``doctor`` end with status 1; a resume drops such a metrics line with a warning;
- a model whose arguments ask for more memory than there is: one config line naming ``model.args`` and its sizes;
- ``optim.lr`` (and every optimizer, schedule, loss-scale and loss-weight number) NaN or infinite: one config line;
- a checkpoint write refused for permissions says "permission denied", never "free space"; a read-only file system
  says so; a full disk and a quota keep their words;
- ``python -m drivetrain.cli.main`` imports from the current folder; ``python -P -m``, ``PYTHONSAFEPATH=1``, the
  console script and ``torchrun --no-python drivetrain`` (the README's form) do not.

The CLI cases run ``drivetrain`` in its own interpreter under an address-space limit and a hard timeout, and
compare snapshots of the folders involved (kinds, sizes, digests, link targets, mtimes) before and after. The
default set runs one kind of hostile value per command (the other kinds, the FIFOs, the infinite rate and the
too-large model through the CLI, and the torchrun form are in the slow set).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import drivetrain.engine.metrics as metrics_module
from drivetrain.cli.main import main
from drivetrain.engine import Checkpointer, ConfigError, load_config
from drivetrain.engine.build import build_model
from drivetrain.engine.checkpoint import DENIED, NO_ROOM, write_reason
from drivetrain.engine.config import ModelConfig
from drivetrain.engine.metrics import truncate_metrics
from drivetrain.engine.registry import register_model
from drivetrain.safeio import json_files
from drivetrain.safeio.json_files import MAX_DEPTH, JSONLimitError, jsonl_records, nesting_depth
from helpers.engine import ON_CPU, ROOT, SMOKE, cli_env, free_port, losses, metrics, overrides
from helpers.fuzz import fuzz_settings
from helpers.refusals import drivetrain_process
from helpers.trees import tree

# The commands finish in 3-6 s on this 2-core machine (most of it importing torch): a bound several times that
# tells a hang from a slow start. The address space: a CLI process that imports torch and trains the smoke model
# stays under 1.5 GiB, so 3 GiB leaves room while a decoder or allocator running away would hit it.
HANG_S = 60
LIMIT_AS = 3 << 30
DEEP = 100_000  # the probe's nesting: 200 KB of brackets
BIG_INT = "1" + "0" * 4000  # 10**4000: an OverflowError as a float


# ---------------------------------------------------------------------------------------------- helpers


def drivetrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``drivetrain ARGS`` in its own interpreter, under LIMIT_AS, killed after HANG_S (TimeoutExpired fails)."""
    return drivetrain_process(*args, timeout=HANG_S, memory=LIMIT_AS, cwd=cwd)


def refusal(proc: subprocess.CompletedProcess, status: int) -> str:
    """The one stderr line of a refused command (exit ``status``, no traceback)."""
    err = proc.stderr.strip()
    assert proc.returncode == status, (proc.returncode, proc.stderr[-3000:])
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def deep_json(prefix: str = "", suffix: str = "") -> str:
    return prefix + "[" * DEEP + "]" * DEEP + suffix


def json_depth(value: object) -> int:
    """Nesting of a decoded value: the reference :func:`nesting_depth` must agree with."""
    if isinstance(value, dict):
        return 1 + max(map(json_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(json_depth, value), default=0)
    return 0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step smoke run: metrics.jsonl, config.yaml, a checkpoint."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", "--config", str(SMOKE), *overrides(out, "train.steps=2", "checkpoint.every=2")]) == 0
    return out


# ---------------------------------------------------------------------------------------------- safe_json itself
def test_nesting_depth_counts_brackets_outside_strings_only() -> None:
    cases = {
        "1": 0,
        "[]": 1,
        "[[],[]]": 2,
        '{"a": [[1], "]"]}': 3,
        '["[[[[", "\\"[[", "\\\\", [["\\\\\\"]"]]]': 3,  # escaped quotes and backslashes inside strings
        '{"k[": {"k{": {"k}": "}}}}"}}}': 3,
        "[" * 70 + "]" * 70: 70,
    }
    for text, depth in cases.items():
        assert nesting_depth(text) == depth, text
        assert nesting_depth(text.encode()) == depth, text


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
    st.text(alphabet=st.sampled_from('ab[]{}"\\/\n\u00e9\u2603'), max_size=12),
)  # fmt: skip
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet="k[]{}\"\\", max_size=4), inner,
                                                                  max_size=4),
    max_leaves=40,
)  # fmt: skip


@fuzz_settings(200)
@given(value=JSON_VALUES, indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans())
def test_nesting_depth_is_the_decoded_values_depth_and_loads_is_json_loads(value, indent, ascii_only) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert nesting_depth(text) == json_depth(value)
    assert json_files.loads(text) == json.loads(text)
    assert json_files.loads(text.encode("utf-16")) == json.loads(text)  # bytes in another encoding, as json takes


def test_nesting_past_the_bound_is_refused_at_its_place_and_the_bound_itself_passes() -> None:
    at_bound = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert json_depth(json_files.loads(at_bound)) == MAX_DEPTH
    with pytest.raises(JSONLimitError, match=rf"^t\.json: JSON nested deeper than {MAX_DEPTH} levels at line 2 "
                                             rf"column {MAX_DEPTH}$"):  # fmt: skip
        json_files.loads('{"a":\n' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}", source="t.json")
    with pytest.raises(JSONLimitError, match=r"^m\.jsonl: line 7: JSON nested deeper than 64 levels at column 65$"):
        json_files.loads(deep_json(), source="m.jsonl", line=7)
    with pytest.raises(JSONLimitError):  # the decoder's RecursionError is never reached
        json_files.loads(deep_json().encode("utf-16"))


@pytest.mark.parametrize(
    ("literal", "fits"),
    [
        (str(2**63 - 1), True),
        (str(-(2**63)), True),
        (str(2**63), False),
        (str(-(2**63) - 1), False),
        ("1" * 25, False),
        (BIG_INT, False),
        ("9" * 5000, False),  # past Python's 4,300-digit conversion limit: refused by us, not by int()
        ("0.000123456789012345678901", True),  # a float's long digit run is no integer
        ("1.5e400", True),  # a float out of range decodes to inf, as json.loads does (the fields' checks refuse it)
    ],
)
def test_integers_outside_64_bits_are_refused_naming_their_place(literal: str, fits: bool) -> None:
    text = '[{"token": "12345678901234567890123"}, {"translation": [' + literal + ", 0]}]"
    if fits:
        assert json_files.loads(text) == json.loads(text)
        return
    with pytest.raises(JSONLimitError, match=r"^e\.json: \[1\]\.translation\[0\]: the integer .* does not fit in "
                                             r"64 bits$") as err:  # fmt: skip
        json_files.loads(text, source="e.json")
    assert len(str(err.value)) < 120  # a 5,000-digit literal is shown by its ends and its length


def test_jsonl_records_skip_a_torn_line_and_refuse_a_hostile_one() -> None:
    text = '{"step": 1}\n{"step": 2, "lo\n' + deep_json() + "\n"
    records = jsonl_records('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n', source="m.jsonl")
    assert [(n, r) for n, _, r in records] == [(1, {"step": 1}), (3, {"step": 3})]
    with pytest.raises(JSONLimitError, match=r"^m\.jsonl: line 3: JSON nested deeper"):
        list(jsonl_records(text, source="m.jsonl"))


# ---------------------------------------------------------------------------------------------- through the CLI
@pytest.mark.parametrize(
    ("table", "content", "place"),
    [
        # deep nesting through the CLI: the predictions' and the metrics' tests below (~1.5 s each)
        pytest.param(
            "scene", deep_json(), "JSON nested deeper than 64 levels at line 1 column 65", marks=pytest.mark.slow
        ),
        pytest.param(
            "sample_annotation",
            deep_json("[", "]"),
            "JSON nested deeper than 64 levels at line 1 column 65",
            marks=pytest.mark.slow,
        ),
        ("ego_pose", None, "[0].translation[0]: the integer 1000000000…000000 (4001 digits) does not fit in 64 bits"),
    ],
)
def test_data_index_refuses_a_hostile_table_in_one_line(
    synth_root: Path, tmp_path: Path, table: str, content: str | None, place: str
) -> None:
    root = tmp_path / "root"
    shutil.copytree(synth_root, root)
    (root / "drivetrain_index.npz").unlink(missing_ok=True)
    path = root / "v1.0-mini" / f"{table}.json"
    if content is None:  # the first row's first coordinate becomes 10**4000
        content = re.sub(r'("translation": \[)[^,]+', lambda m: m.group(1) + BIG_INT, path.read_text(), count=1)
    path.write_text(content)
    before = tree(tmp_path)
    assert refusal(drivetrain("data", "index", "--root", str(root)), 1) == f"data index: {path}: {place}"
    assert tree(tmp_path) == before  # no index written, nothing else touched


@pytest.mark.parametrize("hostile", ["deep", pytest.param("int", marks=pytest.mark.slow)])  # int: the tables' test
def test_eval_refuses_hostile_predictions_in_one_line(synth_root: Path, tmp_path: Path, hostile: str) -> None:
    predictions = tmp_path / "results.json"
    if hostile == "deep":
        predictions.write_text(deep_json('{"meta": {}, "results": ', "}"))
        place = "JSON nested deeper than 64 levels at line 1 column"
    else:
        predictions.write_text('{"meta": {}, "results": {"t": [{"translation": [' + BIG_INT + ", 0, 0]}]}}")
        place = "results.t[0].translation[0]: the integer 1000000000…000000 (4001 digits) does not fit in 64 bits"
    before, data = tree(tmp_path), tree(synth_root)
    line = refusal(drivetrain("eval", "--predictions", str(predictions), "--root", str(synth_root)), 1)
    assert line.startswith(f"eval: {predictions}: predictions: {place}"), line
    # Nothing left: no results_eval/ (eval makes it, and a staging folder in it, before it reads the predictions and
    # removes both on the refusal, so the folder holding them has a new mtime), the data untouched.
    after = tree(tmp_path)
    assert {**after, ".": None} == {**before, ".": None} and tree(synth_root) == data


@pytest.mark.parametrize(  # one command, one kind in the default set; doctor's refusals: the count's test below
    ("hostile", "command"),
    [
        pytest.param("deep", "report", marks=pytest.mark.slow),
        ("int", "report"),
        pytest.param("deep", "doctor", marks=pytest.mark.slow),
        pytest.param("int", "doctor", marks=pytest.mark.slow),
    ],
)
def test_report_and_doctor_refuse_a_hostile_metrics_line_naming_it(
    run: Path, tmp_path: Path, command: str, hostile: str
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    bad = deep_json() if hostile == "deep" else '{"step": 3, "loss": ' + BIG_INT + "}"
    (copy / "metrics.jsonl").write_text("\n".join([*lines, bad]) + "\n")
    before = tree(tmp_path)
    args = [copy] if command == "report" else ["--no-profile", copy]
    line = refusal(drivetrain(command, *map(str, args)), 1)
    place = "JSON nested deeper than 64 levels at column 65" if hostile == "deep" else "loss: the integer"
    assert line.startswith(f"{command}: {copy / 'metrics.jsonl'}: line {len(lines) + 1}: {place}"), line
    assert tree(tmp_path) == before  # no picture, report.md or doctor.md written


def test_metrics_records_keep_numbers_only(tmp_path: Path) -> None:
    """What the logger never writes (a string where a time goes, a record without a numeric step) is left out,
    so report's and doctor's arithmetic only meets numbers (a string time was a TypeError traceback in both)."""
    from drivetrain.viz.curves import read_metrics

    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 1.5, "step_time_s": "x", "data_wait_s": [1], "lr": true}\n'
        '{"step": "2", "loss": 1.0}\n[3]\n{"step": 3, "loss": NaN, "eval/mAP": 0.5}\n{"step": 4, "eval/NDS": 0.25}\n'
    )
    train, evals = read_metrics(tmp_path)
    assert train[0] == {"step": 1, "loss": 1.5}
    assert [r["step"] for r in train] == [1, 3] and evals == [{"step": 4, "eval/NDS": 0.25}]


def test_doctor_names_a_count_that_is_not_one(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    with (copy / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 1.0, "step_time_s": "x", "data_wait_s": "y", "skipped_steps": Infinity}\n')
    before = tree(tmp_path)
    line = refusal(drivetrain("doctor", "--no-profile", str(copy)), 1)
    assert line == f"doctor: {copy / 'metrics.jsonl'}: skipped_steps: expected a count, got inf"
    assert tree(tmp_path) == before


def test_a_resume_drops_a_hostile_metrics_line_with_a_one_line_warning(tmp_path: Path) -> None:
    assert main(["train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=2", "checkpoint.every=2")]) == 0
    path = tmp_path / "metrics.jsonl"
    path.write_text(path.read_text() + deep_json() + "\n")
    proc = drivetrain("train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=4", "checkpoint.every=2"),
                      "--resume", "auto")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [ln for ln in proc.stderr.splitlines() if "Warning" in ln or "Traceback" in ln]
    # lines 1-3: steps 1 and 2 and the step-2 save's checkpoint/stall_s; line 4 the hostile one
    assert warnings == [f"drivetrain: RuntimeWarning: {path}: line 4: JSON nested deeper than 64 levels at column 65; "
                        "dropping that line"]  # fmt: skip
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3, 4]


def test_truncate_metrics_keeps_only_records_up_to_the_step(tmp_path: Path) -> None:
    """Lines that are no records of a step (a list, a step that is no number) go as torn lines do."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n[1, 2]\n{"step": "x"}\n{"step": 2}\n{"step": 3}\n{"ste')
    truncate_metrics(path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


# ---------------------------------------------------------------------------------------------- model sizes
@pytest.mark.slow  # ~4 s; an allocation failure as a config line: the test below, in-process
def test_a_model_too_large_to_allocate_is_one_config_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    before = tree(tmp_path)
    proc = drivetrain("train", "--config", str(SMOKE), *overrides(out, "model.args.width=10000000"))
    line = refusal(proc, 2)
    assert line.startswith(
        "drivetrain train: config error: model.args: smoke cannot be built with these sizes (width=10000000, "
    ), line
    assert re.search(r": cannot allocate [\d.]+ TiB at once$", line), line
    assert tree(tmp_path) == before  # refused before the run directory was made


@register_model("test-fails-to-build")
def _fails_to_build(error: str = "runtime") -> torch.nn.Module:
    raise {"runtime": RuntimeError("index 3 is out of bounds"), "memory": MemoryError()}[error]


def test_only_allocation_failures_of_a_builder_become_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"^model\.args: test-fails-to-build cannot be built with these sizes "
                                          r"\(no integer arguments\): out of memory$"):  # fmt: skip
        build_model(ModelConfig("test-fails-to-build", {"error": "memory"}))
    with pytest.raises(RuntimeError, match="index 3 is out of bounds"):  # a bug is not a size: seen whole
        build_model(ModelConfig("test-fails-to-build", {"error": "runtime"}))


# ---------------------------------------------------------------------------------------------- non-finite numbers
@pytest.mark.parametrize(
    "override",
    [
        "optim.lr=.inf", "optim.lr=.nan", "optim.lr=1e400", "optim.lr=-.inf", "optim.weight_decay=.inf",
        "optim.eps=.nan", "optim.clip_norm=.inf", "optim.betas=[0.9, .nan]", "schedule.div_factor=.inf",
        "schedule.final_div_factor=.nan", "schedule.min_lr_ratio=.nan", "precision.init_scale=.inf",
        "precision.growth_factor=.inf", "precision.min_scale=.nan", "model.loss_weights.cls=.inf",
        "optim.groups=[{modules: [backbone], lr_mult: .inf}]",
        "optim.groups=[{modules: [backbone], weight_decay: .nan}]",
        f"optim.lr={10**400}",
    ],
)  # fmt: skip
def test_non_finite_optimizer_and_schedule_numbers_are_refused_naming_the_key(tmp_path: Path, override: str) -> None:
    key = override.split("=", 1)[0]
    if key == "optim.groups":
        key = "optim.groups[]." + ("lr_mult" if "lr_mult" in override else "weight_decay")
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: must be a finite number, got "):
        load_config(SMOKE, overrides(tmp_path, override))


@pytest.mark.slow  # ~3 s; the same refusal in-process: the non-finite numbers' test above
def test_an_infinite_learning_rate_is_one_line_and_trains_nothing(tmp_path: Path) -> None:
    before = tree(tmp_path)
    line = refusal(drivetrain("train", "--config", str(SMOKE), *overrides(tmp_path / "run", "optim.lr=.inf")), 2)
    assert line == "drivetrain train: config error: override optim.lr=.inf: optim.lr: must be a finite number, got inf"
    assert tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------- write failures
def test_write_failures_say_what_they_are() -> None:
    for code in NO_ROOM:
        reason, fix = write_reason(OSError(code, os.strerror(code)))
        assert reason == NO_ROOM[code]
        assert fix == ("make it writable" if code == errno.EROFS else "free space")
    for code in DENIED:
        reason, fix = write_reason(PermissionError(code, os.strerror(code), "/x/state.pt"))
        assert (reason, fix) == (f"{DENIED[code]}: /x/state.pt", "make it writable for this user")
    assert write_reason(OSError(errno.EIO, "Input/output error")) == ("[Errno 5] Input/output error", "fix that")


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT],
                         ids=["EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT"])  # fmt: skip
def test_a_refused_checkpoint_write_names_its_cause(tmp_path: Path, monkeypatch, capsys, code: int) -> None:
    """Making the save's folder fails with ``code`` (a checkpoints folder this user may not write, on a read-only
    mount, a full disk): a permission is never called a lack of space; the committed checkpoints are kept."""
    argv = ["train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=4", "checkpoint.every=2")]
    assert main(argv) == 0
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args, **kwargs) -> None:
        if self.name.startswith(".step-"):
            raise (PermissionError if code in DENIED else OSError)(code, os.strerror(code), str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    capsys.readouterr()
    argv = ["train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=6", "checkpoint.every=2")]
    assert main([*argv, "--resume", "auto"]) == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and not ln.startswith("resumed from")]
    assert len(lines) == 1, lines
    ckpt = tmp_path / "checkpoints"
    assert lines[0].startswith(f"drivetrain train: checkpoint error: cannot write a checkpoint in {ckpt} (")
    why = lines[0].split(f"{ckpt} (", 1)[1]
    if code in DENIED:
        assert why.startswith(f"{DENIED[code]}: {ckpt}/.step-00000006.tmp-"), why
        assert why.endswith("the older checkpoints are kept — make it writable for this user, then --resume auto")
        assert "free" not in why and "disk" not in why  # neither "free space" nor "N MiB free"
    elif code == errno.EROFS:
        assert why.startswith("the file system is read-only; ") and "— make it writable, then" in why, why
    else:
        assert re.match(rf"{NO_ROOM[code]}; \d+ MiB free\).* — free space, then --resume auto$", why), why
    assert [s for s, _ in Checkpointer(ckpt).committed()] == [2, 4]


def test_a_refused_metrics_write_names_permissions(tmp_path: Path, monkeypatch, capsys) -> None:
    def denied_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(metrics_module, "open", denied_open, raising=False)
    assert main(["train", "--config", str(SMOKE), *overrides(tmp_path, "train.steps=2")]) == 1
    err = capsys.readouterr().err.strip()
    path = tmp_path / "metrics.jsonl"
    assert err == (f"drivetrain train: cannot write {path} (permission denied: {path}); the committed checkpoints are "
                   "kept — make it writable for this user, then --resume auto")  # fmt: skip


# ---------------------------------------------------------------------------------------------- python -m
PLANTED = """import pathlib
pathlib.Path(__file__).with_name("RAN").write_text("a module of the current folder was imported")
raise SystemExit("planted argparse imported")
"""


@pytest.fixture
def hostile_cwd(tmp_path: Path) -> Path:
    """A folder holding ``argparse.py``: imported by ``python -m`` from there, it leaves ``RAN`` beside itself."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "argparse.py").write_text(PLANTED)
    return folder


def safe_env() -> dict[str, str]:
    """cli_env without the empty entry its PYTHONPATH ends in when none was set (``src:``): an empty entry is the
    current folder, for every way of starting Python (docs/safety.md)."""
    return {**cli_env(), "PYTHONPATH": os.pathsep.join(p for p in cli_env()["PYTHONPATH"].split(os.pathsep) if p)}


def _console_script() -> str | None:
    found = Path(sys.executable).with_name("drivetrain")
    return str(found) if found.is_file() else shutil.which("drivetrain")


def test_python_m_imports_from_the_current_folder_and_the_safe_forms_do_not(hostile_cwd: Path) -> None:
    env = safe_env()

    def version(argv: list[str], **extra: str) -> subprocess.CompletedProcess:
        (hostile_cwd / "RAN").unlink(missing_ok=True)
        return subprocess.run(argv, env={**env, **extra}, cwd=hostile_cwd, capture_output=True, text=True,
                              timeout=HANG_S, check=False)  # fmt: skip

    plain = version([sys.executable, "-m", "drivetrain.cli.main", "--version"])  # what docs/safety.md warns of
    assert plain.returncode != 0 and (hostile_cwd / "RAN").exists(), plain.stderr
    forms = []
    if sys.version_info >= (3, 11):  # -P and PYTHONSAFEPATH are Python 3.11's; 3.10 ignores the variable
        forms.append(([sys.executable, "-m", "drivetrain.cli.main", "--version"], {"PYTHONSAFEPATH": "1"}))
        forms.append(([sys.executable, "-P", "-m", "drivetrain.cli.main", "--version"], {}))
    if _console_script() is not None:
        forms.append(([_console_script(), "--version"], {}))
    for argv, extra in forms:
        proc = version(argv, **extra)
        assert proc.returncode == 0 and proc.stdout.startswith("drivetrain "), (argv, proc.stderr)
        assert not (hostile_cwd / "RAN").exists(), argv
    if not forms:
        pytest.skip("neither Python 3.11's -P nor the drivetrain console script is available")


@pytest.mark.slow  # ~5 s; the safe forms without torchrun: the test above
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_the_readme_torchrun_form_trains_without_importing_from_the_current_folder(
    hostile_cwd: Path, tmp_path: Path
) -> None:
    """``torchrun --no-python drivetrain train ...`` as README.md writes it: the ``torchrun`` and ``drivetrain``
    console scripts (each puts its own folder on the path, not the current one), run from a folder holding a
    planted module, train two ranks."""
    launcher, script = Path(sys.executable).with_name("torchrun"), _console_script()
    if script is None or not launcher.is_file():
        pytest.skip("the torchrun and drivetrain console scripts are not installed")
    readme = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("torchrun")]
    assert readme and all(" --no-python drivetrain train " in line for line in readme), readme
    args = overrides(tmp_path / "run", "train.steps=3", "distributed.strategy=ddp", *ON_CPU)
    cmd = [str(launcher), "--nproc_per_node", "2", "--master_port", str(free_port()), "--no-python", script, "train",
           "--config", str(SMOKE), *args]  # fmt: skip
    proc = subprocess.run(cmd, env=safe_env(), cwd=hostile_cwd, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stderr[-4000:]}"
    assert proc.stdout.count("3/3 steps") == 1  # only rank 0 reports
    assert len(losses(tmp_path / "run")) == 3
    assert not (hostile_cwd / "RAN").exists()


# ------------------------------------------------------------------------------ special files, huge literals
@pytest.mark.slow  # ~4 s; a FIFO refused: tests/test_safety_reads.py
def test_a_fifo_as_predictions_or_a_table_is_one_line_not_missing_and_not_a_hang(synth_root: Path, tmp_path: Path):
    """A FIFO where a predictions file or a nuScenes table belongs is refused as what it is (not "does not exist",
    which is what an ``is_file()`` pre-check said), in seconds: the read never opens it for reading."""
    predictions = tmp_path / "results.json"
    os.mkfifo(predictions)
    line = refusal(drivetrain("eval", "--predictions", str(predictions), "--root", str(synth_root)), 1)
    assert line == f"eval: {predictions}: cannot read predictions (a FIFO (named pipe), not a regular file)", line
    root = tmp_path / "root"
    shutil.copytree(synth_root, root, ignore=shutil.ignore_patterns("samples", "sweeps", "drivetrain_index.npz"))
    table = root / "v1.0-mini" / "scene.json"
    table.unlink()
    os.mkfifo(table)
    line = refusal(drivetrain("data", "index", "--root", str(root)), 1)
    assert line == f"data index: {table}: cannot read nuScenes table 'scene' (a FIFO (named pipe), not a regular file)"


def test_a_yaml_integer_too_long_to_convert_is_one_config_line(tmp_path: Path) -> None:
    """PyYAML converts an integer with ``int(str)``, which refuses more than 4300 digits with a ValueError that
    advises ``sys.set_int_max_str_digits``: the bounded loader makes it a YAML error at its place."""
    config = tmp_path / "big.yaml"
    config.write_text(f"base: {SMOKE.name}\noptim:\n  lr: 1{'0' * 5000}\n")
    shutil.copy(SMOKE, tmp_path / SMOKE.name)
    line = refusal(drivetrain("train", "--config", str(config), "--print-config"), 2)
    assert "holds an integer of 5001 characters, too long to convert (line 3, column 7)" in line, line
    assert "set_int_max_str_digits" not in line
