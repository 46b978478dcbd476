"""The registry is the only way from a name in a file to code: every door that reads a config, a run directory or
a checkpoint refuses an unregistered name in one line, imports nothing for it and calls nothing.

The hostile module below stands for any importable gadget (a function in torch, numpy or the standard library, or
a YAML file that is also Python): importing it writes a file and changes ``sys.path``; calling its builders
writes another file. Each test asserts the refusal and that none of that happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from drivetrain.cli.main import main
from drivetrain.engine import old_spellings, registry
from drivetrain.engine.build import build_dataset, build_model
from drivetrain.engine.checkpoint import Checkpointer
from drivetrain.engine.config import ConfigError, DataConfig, ModelConfig, config_diff
from drivetrain.engine.config_files import read_config_file

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
HOSTILE = "hostile_gadget"

HOSTILE_SOURCE = """
import sys
from pathlib import Path

import torch

Path({imported!r}).write_text("imported")
sys.path.insert(0, "/hostile-path")


class Net(torch.nn.Module):  # passes every 'is it a model' check the old builder made
    def __init__(self, **kwargs):
        super().__init__()
        Path({called!r}).write_text("called")

    def loss(self, outputs, batch):
        return {{}}


def data(**kwargs) -> dict:  # a return annotation with __getitem__ and __len__
    Path({called!r}).write_text("called")
    return {{}}
"""


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """An importable hostile module on sys.path; yields the files its import and its builders would write."""
    site = tmp_path / "site"
    site.mkdir()
    imported, called = tmp_path / "imported.txt", tmp_path / "called.txt"
    (site / f"{HOSTILE}.py").write_text(HOSTILE_SOURCE.format(imported=str(imported), called=str(called)))
    monkeypatch.syspath_prepend(str(site))
    path_before = list(sys.path)
    yield imported, called
    assert HOSTILE not in sys.modules, "the hostile module was imported"
    assert not imported.exists(), "the hostile module's import-time code ran"
    assert not called.exists(), "a hostile builder was called"
    assert "/hostile-path" not in sys.path and sys.path == path_before


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    """Run the CLI in-process as the console script would: ``(exit status, stderr)``."""
    try:
        rc = main(argv)
    except SystemExit as exit_:  # SystemExit("message") prints the message and exits 1
        rc = exit_.code if isinstance(exit_.code, int) else 1
        print(exit_.code if isinstance(exit_.code, str) else "", file=sys.stderr)
    return rc, capsys.readouterr().err


def _refused(capsys, argv: list[str]) -> str:
    """The command must fail (status 1 or 2) with one stderr line and no traceback; returns the line."""
    rc, err = _run(capsys, argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc in (1, 2), err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _smoke_run(tmp_path: Path, capsys) -> Path:
    """A finished two-step smoke run (config.yaml, a committed checkpoint)."""
    run = tmp_path / "run"
    argv = ["train", "--config", str(SMOKE), f"run.out_dir={run}", "train.steps=2", "log.progress=false"]
    assert main([*argv, "log.tensorboard=false", "checkpoint.every=1"]) == 0
    capsys.readouterr()
    return run


def _poison_run(run: Path, section: str, name: str) -> None:
    """Rewrite the run's config.yaml and its newest checkpoint's stored config to name ``name`` in ``section``."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg[section]["name"] = name
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    ckpts = Checkpointer(run / "checkpoints")
    path, state = ckpts.load_latest()
    state["config"][section]["name"] = name
    ckpts.save(int(path.name.split("-")[1]) + 1, state)  # a valid, committed checkpoint carrying the name


# ------------------------------------------------------------------ the registry itself
@pytest.mark.parametrize(
    ("kind", "name", "attr"),
    [
        ("model", "streampetr", "StreamPETR"),
        ("model", "pointpillars", "PointPillars"),
        ("model", "ssn", "SSN"),
        ("model", "focal2d", "FocalDetector2D"),
        ("model", "smoke", "SmokeModel"),
        ("data", "synthetic", "synthetic"),
        ("data", "frames", "frames"),
        ("data", "smoke", "SmokeDataset"),
    ],
)
def test_builtin_names_resolve_to_our_builders(kind, name, attr):
    assert registry.lookup(kind, name).__name__ == attr


@pytest.mark.parametrize(("kind", "alias"), [(k, a) for k, table in old_spellings.ALIASES.items() for a in table])
def test_old_module_spellings_of_our_builders_resolve_through_the_fixed_alias_table(kind, alias):
    assert registry.lookup(kind, alias) is registry.lookup(kind, old_spellings.ALIASES[kind][alias])


def test_our_models_are_described_by_their_specs_summary_and_named_once():
    rows = {name: (where, purpose) for name, where, purpose in registry.describe("model")}
    for name in registry.MODELS:
        assert rows[name] == ("drivetrain", registry.model_spec(name).summary)
        assert registry.model_spec(name).summary  # every spec of ours has one
        assert registry.origin("model", name) == "drivetrain"
    assert registry.origin("model", "drivetrain.models:StreamPETR") == "drivetrain"  # an old spelling: the same
    assert registry.origin("model", "fancy") == "unknown"
    assert all(len(entry) == 2 for entry in registry.MODELS.values())  # (module, spec): the spec says the rest


def test_an_unknown_name_is_one_line_listing_the_known_names():
    with pytest.raises(ConfigError) as err:
        registry.lookup("model", "fancy")
    message = str(err.value)
    assert "\n" not in message and message.startswith("model.name: unknown model 'fancy'")
    assert all(name in message for name in ("streampetr", "pointpillars", "ssn", "focal2d", "smoke"))


def test_a_resumed_run_may_spell_its_builder_the_old_or_the_new_way():
    saved = {"model": {"name": "drivetrain.models:StreamPETR"}, "data": {"name": "drivetrain.data.sources:frames"}}
    assert config_diff(saved, {"model": {"name": "streampetr"}, "data": {"name": "frames"}}) == []
    assert config_diff(saved, {"model": {"name": "ssn"}, "data": {"name": "frames"}}) == [
        "model.name: 'streampetr' → 'ssn'"
    ]


def test_registering_refuses_our_names_bad_names_and_a_second_builder():
    with pytest.raises(ValueError, match="drivetrain's own"):
        registry.register_model("streampetr", torch.nn.Linear)
    with pytest.raises(ValueError, match="short name"):
        registry.register_model("my.module:Net", torch.nn.Linear)
    registry.register_model("test-linear", torch.nn.Linear)
    try:
        registry.register_model("test-linear", torch.nn.Linear)  # the same builder again is fine
        with pytest.raises(ValueError, match="already registered"):
            registry.register_model("test-linear", torch.nn.Bilinear)
    finally:
        registry._REGISTERED["model"].pop("test-linear")


# ------------------------------------------------------------------ every door, hostile names
@pytest.mark.parametrize(
    "name",
    [
        f"{HOSTILE}:Net",
        f"{HOSTILE}:data",
        f"{HOSTILE}",
        "os:system",
        "numpy:memmap",
        "this:x",
        "drivetrain.models.streampetr.detector:torch",  # our own package, but not in the alias table
    ],
)
def test_build_refuses_any_name_outside_the_registry_without_importing_it(hostile, name):
    registry.known_names("model")  # importlib.metadata's own lazy imports happen here, not below
    modules_before = set(sys.modules)
    with pytest.raises(ConfigError, match=r"model\.name: unknown model"):
        build_model(ModelConfig(name=name))
    with pytest.raises(ConfigError, match=r"data\.name: unknown dataset"):
        build_dataset(DataConfig(name=name))
    assert set(sys.modules) == modules_before  # nothing at all was imported


def test_train_refuses_a_hostile_name_from_the_config_file_and_from_an_override(hostile, tmp_path, capsys):
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["model"]["name"] = f"{HOSTILE}:Net"
    config = tmp_path / "hostile.yaml"
    config.write_text(yaml.safe_dump(cfg))
    line = _refused(capsys, ["train", "--config", str(config), f"run.out_dir={tmp_path / 'a'}"])
    assert f"unknown model '{HOSTILE}:Net'" in line
    line = _refused(capsys, ["train", "--config", str(SMOKE), f"data.name={HOSTILE}:data", f"run.out_dir={tmp_path}/b"])
    assert f"unknown dataset '{HOSTILE}:data'" in line
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    args = f"data.args={{filename: {victim}, mode: w+, shape: 64}}"
    _refused(capsys, ["train", "--config", str(SMOKE), "data.name=numpy:memmap", args, f"run.out_dir={tmp_path}/c"])
    assert victim.read_text() == "precious"
    assert not any((tmp_path / d).exists() for d in "abc")  # no run directory was made either


@pytest.mark.parametrize("section", ["model", "data"])
def test_commands_reading_a_run_directory_refuse_its_hostile_names(hostile, tmp_path, capsys, section):
    run = _smoke_run(tmp_path, capsys)
    _poison_run(run, section, f"{HOSTILE}:{'Net' if section == 'model' else 'data'}")
    snapshot = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.name != ".drivetrain.lock"}
    what = "model" if section == "model" else "dataset"
    # eval --checkpoint and viz frame --checkpoint rebuild the model (then the data) from the checkpoint's config
    eval_line = _refused(capsys, ["eval", "--checkpoint", str(run)])
    if section == "model":
        assert f"unknown model '{HOSTILE}" in eval_line
    else:  # the smoke model makes no detections: refused before its data is built (build_dataset: tested above)
        assert f"unknown dataset '{HOSTILE}" in eval_line or "makes no 3D detections" in eval_line
    # doctor re-trains a short window from the run's config.yaml
    assert f"unknown {what} '{HOSTILE}" in _refused(capsys, ["doctor", str(run)])
    # --resume: the current config decides what is built; a stored config that differs is refused, never built
    resume = ["train", "--config", str(SMOKE), f"run.out_dir={run}", "--resume", "auto", "log.tensorboard=false"]
    rc, err = _run(capsys, resume)  # the refusal lists every differing key, one per line
    assert rc == 2 and "Traceback" not in err and f"{section}.name: '{HOSTILE}:" in err
    # report only reads metrics and the stored config: it must not build (or import) anything either
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.name != ".drivetrain.lock"} == snapshot


def test_viz_frame_refuses_a_checkpoint_naming_a_hostile_model(hostile, tmp_path, capsys):
    run = _smoke_run(tmp_path, capsys)
    _poison_run(run, "model", f"{HOSTILE}:Net")
    png = tmp_path / "f.png"
    line = _refused(capsys, ["viz", "frame", "--checkpoint", str(run), "--frame", "0", "--png", str(png)])
    assert f"unknown model '{HOSTILE}:Net'" in line
    assert not png.exists()


def test_tune_loader_refuses_a_config_naming_a_hostile_dataset(hostile, tmp_path, capsys):
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["data"]["name"] = f"{HOSTILE}:data"
    config = tmp_path / "hostile.yaml"
    config.write_text(yaml.safe_dump(cfg))
    line = _refused(capsys, ["tune", "loader", "--config", str(config), "--steps", "1", "--warmup", "0"])
    assert f"unknown dataset '{HOSTILE}:data'" in line


# ------------------------------------------------------------------ how users add their own
PLUGIN_SOURCE = """
from pathlib import Path

import torch

from drivetrain.models.smoke import SmokeModel

Path({imported!r}).write_text("imported")


class TinyNet(SmokeModel):
    '''The smoke model under a plugin's name.'''
"""


def _plugin_site(tmp_path: Path, *, entry_point: bool) -> tuple[Path, Path]:
    """A folder with the package ``dtplugin`` (and, if asked, its installed metadata with an entry point)."""
    site = tmp_path / "site"
    (site / "dtplugin").mkdir(parents=True)
    imported = tmp_path / "plugin-imported.txt"
    (site / "dtplugin" / "__init__.py").write_text(PLUGIN_SOURCE.format(imported=str(imported)))
    (site / "dtplugin" / "register.py").write_text(
        "from drivetrain.engine.registry import register_model\nfrom dtplugin import TinyNet\n"
        "register_model('tinynet', TinyNet)\n"
    )
    if entry_point:  # what `pip install` of a package declaring [project.entry-points."drivetrain.models"] leaves
        info = site / "dtplugin-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dtplugin\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("[drivetrain.models]\ntinynet = dtplugin:TinyNet\n")
    return site, imported


def _cli(site: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "drivetrain.cli.main", *argv], capture_output=True, text=True, env=env, timeout=300
    )


def test_an_installed_entry_point_registers_a_model_imported_only_when_named(tmp_path):
    site, imported = _plugin_site(tmp_path, entry_point=True)
    common = ["train", "--config", str(SMOKE), "train.steps=2", "log.tensorboard=false", "log.progress=false"]
    other = _cli(site, *common, "model.name=nosuchmodel", f"run.out_dir={tmp_path / 'x'}")
    assert other.returncode == 2 and "tinynet" in other.stderr  # listed from the metadata ...
    assert not imported.exists()  # ... without importing the package
    done = _cli(site, *common, "model.name=tinynet", f"run.out_dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr
    assert imported.exists()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 2


@pytest.mark.slow  # ~8 s; an entry point: the test above; typed args checked at load: tests/test_detector_spec.py
def test_an_entry_point_may_name_a_spec_whose_typed_args_are_checked_when_the_config_loads(tmp_path):
    site, _ = _plugin_site(tmp_path, entry_point=True)
    (site / "dtplugin" / "spec.py").write_text(
        "from dataclasses import dataclass\n\nfrom drivetrain.detector.spec import ModelSpec\n"
        "from dtplugin import TinyNet\n\n"
        "@dataclass(frozen=True)\nclass TinyArgs:\n    channels: int = 3\n    width: int = 8\n    depth: int = 2\n"
        "    dims: int = 2\n    dropout: float = 0.0\n    memory: bool = False\n\n"
        "def build(args):\n    return TinyNet(**vars(args))\n\n"
        "SPEC = ModelSpec('tinyspec', build=build, args=TinyArgs, modalities=frozenset({'tensor'}))\n"
    )
    with (site / "dtplugin-0.1.dist-info" / "entry_points.txt").open("a") as f:
        f.write("tinyspec = dtplugin.spec:SPEC\n")
    common = ["train", "--config", str(SMOKE), "train.steps=1", "log.tensorboard=false", "log.progress=false",
              "model.name=tinyspec"]  # fmt: skip
    refused = _cli(site, *common, "model.args.colour=3", f"run.out_dir={tmp_path / 'x'}")
    assert refused.returncode == 2 and "model.args.colour: unknown key; known keys: channels, " in refused.stderr
    assert not (tmp_path / "x").exists()  # refused when the config loaded, before a run folder was made
    done = _cli(site, *common, "model.args.width=4", f"run.out_dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["args"] == {"channels": 3, "width": 4, "depth": 3, "dims": 2, "dropout": 0.1, "memory": True}


def test_a_plugin_typed_on_the_command_line_registers_a_model(tmp_path, monkeypatch, capsys):
    site, imported = _plugin_site(tmp_path, entry_point=False)
    monkeypatch.syspath_prepend(str(site))
    run = tmp_path / "run"
    base = ["train", "--config", str(SMOKE), "model.name=tinynet", f"run.out_dir={run}", "train.steps=2"]
    try:
        assert "unknown model 'tinynet'" in _refused(capsys, base)  # without --plugin the name is unknown
        assert main([*base, "--plugin", "dtplugin.register", "log.tensorboard=false", "log.progress=false"]) == 0
        assert imported.exists() and (run / "config.yaml").is_file()
        assert "tinynet" in registry.known_names("model")
    finally:
        registry._REGISTERED["model"].pop("tinynet", None)
        for name in [m for m in sys.modules if m.startswith("dtplugin")]:
            del sys.modules[name]


def test_a_plugin_that_fails_to_import_is_one_line(capsys):
    line = _refused(capsys, ["train", "--config", str(SMOKE), "--plugin", "no_such_plugin_module"])
    assert line.startswith("drivetrain train: --plugin no_such_plugin_module: cannot import it")


def test_a_plugin_off_the_import_path_says_how_to_put_it_there(tmp_path, monkeypatch, capsys):
    """The console script leaves the current folder off the import path (docs/safety.md): a plugin there is told how
    to be found; a package found without the module, and a plugin whose own import fails, are told what they are."""
    (tmp_path / "myproj").mkdir()
    (tmp_path / "myproj" / "__init__.py").write_text("")
    (tmp_path / "broken.py").write_text("import no_such_dependency_of_the_plugin\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    line = _refused(capsys, ["train", "--config", str(SMOKE), "--plugin", "myproj.bevgrid"])
    assert line.startswith(
        "drivetrain train: --plugin myproj.bevgrid: cannot import it (ModuleNotFoundError: No module named 'myproj'); "
        "myproj is in the current folder, which drivetrain leaves off the import path (docs/safety.md): put the "
        f"folder that holds it on the path, PYTHONPATH={tmp_path}"
    ), line
    monkeypatch.chdir(tmp_path / "myproj")  # elsewhere: the folder is the user's to name
    line = _refused(capsys, ["train", "--config", str(SMOKE), "--plugin", "myproj.bevgrid"])
    assert (
        "no folder on the import path holds myproj: put the folder that holds it on the path, PYTHONPATH=FOLDER" in line
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        line = _refused(capsys, ["train", "--config", str(SMOKE), "--plugin", "myproj.bevgrid"])
        assert line.endswith(f"; the package myproj ({tmp_path / 'myproj'}) holds no module bevgrid"), line
        line = _refused(capsys, ["train", "--config", str(SMOKE), "--plugin", "broken"])
        assert line.endswith("(ModuleNotFoundError: No module named 'no_such_dependency_of_the_plugin')"), line
    finally:
        for name in [m for m in sys.modules if m.startswith(("myproj", "broken"))]:
            del sys.modules[name]


def test_a_plugin_in_a_config_file_is_not_a_thing(tmp_path, capsys):
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["plugins"] = [HOSTILE]
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert "plugins: unknown key" in _refused(capsys, ["train", "--config", str(config)])


def test_shipped_configs_name_registered_builders_only():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        cfg = read_config_file(path).data  # with its base chain
        assert cfg["model"]["name"] in registry.MODELS, path.name
        assert cfg["data"]["name"] in registry.DATASETS, path.name
