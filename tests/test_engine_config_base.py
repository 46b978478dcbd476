"""Configs that start from others: ``base:`` chains merged per key, ``unset``, the file rules (relative ``.yaml`` paths,
no loops, at most 16 deep), errors naming the file of the chain that set the bad key, overrides after the chain, the
resolved config in the run directory, ``--print-config`` and ``drivetrain configs``.

The shipped configs were folded onto shared bases (configs/_base/, and siblings: ``voxelnet_tiny`` starts from
``pointpillars_tiny``); ``fixtures/configs_resolved.json`` holds what every shipped config said *before* the fold,
generated from the flat files with::

    python - <<'EOF'
    import json, yaml; from pathlib import Path
    out = {p.name: yaml.safe_load(p.read_text()) for p in sorted(Path("configs").glob("*.yaml"))}
    Path("tests/fixtures/configs_resolved.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\\n")
    EOF

and :func:`test_every_shipped_config_resolves_to_what_it_said_before_the_fold` holds the merged chains equal to it.
A config changed on purpose (or a new one) updates its entry with ``read_config_file(path).data`` in place of
``yaml.safe_load``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from drivetrain.cli.main import main
from drivetrain.engine import ConfigError, Trainer, load_config
from drivetrain.engine.config import config_to_dict
from drivetrain.engine.config_files import MAX_BASE_DEPTH, merge_config, read_config_file
from helpers.engine import SMOKE, overrides

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
PREFOLD = json.loads((Path(__file__).parent / "fixtures" / "configs_resolved.json").read_text())


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def smoke_base(folder: Path) -> Path:
    """configs/smoke.yaml copied into ``folder``: a complete config to start from."""
    return write(folder / "smoke_base.yaml", SMOKE.read_text())


# ---------------------------------------------------------------------- merging
def test_a_chain_of_three_merges_every_file_the_nearest_winning(tmp_path):
    smoke_base(tmp_path / "a")
    write(tmp_path / "b" / "mid.yaml", "base: ../a/smoke_base.yaml\noptim: {lr: 0.5}\ntrain: {steps: 7}\n")
    top = write(tmp_path / "c" / "top.yaml", "base: ../b/mid.yaml\noptim: {lr: 0.25}\nlog: {every: 3}\n")
    source = read_config_file(top)
    assert source.chain == (top, tmp_path / "b" / "mid.yaml", tmp_path / "a" / "smoke_base.yaml")
    cfg = load_config(top)
    assert cfg.optim.lr == 0.25  # top over mid over base
    assert cfg.train.steps == 7  # from the middle
    assert cfg.log.every == 3  # from the top only
    assert cfg.optim.clip_norm == 5.0 and cfg.model.name == "smoke"  # from the base only
    assert "base" not in source.data and "unset" not in source.data
    flat = config_to_dict(load_config(SMOKE, ["optim.lr=0.25", "train.steps=7", "log.every=3"]))
    assert config_to_dict(cfg) == flat  # the chain is the same config as the flat file with those three keys


def test_mappings_merge_per_key_and_lists_and_scalars_replace(tmp_path):
    smoke_base(tmp_path)
    child = write(
        tmp_path / "child.yaml",
        "base: smoke_base.yaml\n"
        "model: {args: {width: 8}}\n"  # one builder argument: the others stay the base's
        "optim: {betas: [0.8, 0.9], groups: [{modules: [head], lr_mult: 2.0}]}\n",  # lists replace whole
    )
    cfg = load_config(child)
    base = load_config(SMOKE)
    assert cfg.model.args == {**base.model.args, "width": 8}
    assert cfg.optim.betas == [0.8, 0.9]
    assert [(g.modules, g.lr_mult) for g in cfg.optim.groups] == [(["head"], 2.0)]  # not appended to [backbone]
    assert cfg.optim.lr == base.optim.lr and cfg.optim.weight_decay == base.optim.weight_decay


def test_merge_config_leaves_its_arguments_alone():
    base = {"optim": {"lr": 1.0, "betas": [0.9, 0.99]}, "model": {"args": {"a": 1}}}
    child = {"optim": {"betas": [0.5, 0.6]}, "model": {"args": {"b": 2}}}
    before = json.dumps([base, child])
    merged = merge_config(base, child)
    assert merged == {"optim": {"lr": 1.0, "betas": [0.5, 0.6]}, "model": {"args": {"a": 1, "b": 2}}}
    merged["optim"]["betas"].append(0)
    assert json.dumps([base, child]) == before


def test_null_is_a_value_that_replaces_not_a_way_to_inherit(tmp_path):
    """``bev: null`` turns the inherited BEV step off (its default is on): null must never mean "the default"."""
    base = CONFIGS / "streampetr_tiny_aug.yaml"
    assert load_config(base).data.augment.camera.bev is not None
    relative = os.path.relpath(base, tmp_path)  # ../../…/configs/streampetr_tiny_aug.yaml
    child = write(
        tmp_path / "child.yaml",
        f"base: {relative}\ndata: {{augment: {{camera: {{bev: null}}}}}}\noptim: {{clip_norm: null}}\n",
    )
    cfg = load_config(child)
    assert cfg.data.augment.camera.bev is None  # off, as the child says
    assert cfg.data.augment.camera.image.final_size == (256, 96)  # the rest of the camera section inherited
    assert cfg.optim.clip_norm is None


def test_unset_removes_an_inherited_key_so_the_default_applies(tmp_path):
    smoke_base(tmp_path)
    child = write(
        tmp_path / "child.yaml",
        "base: smoke_base.yaml\nunset: [model.args.dropout, optim.clip_norm, model.loss_weights]\n"
        "model: {loss_weights: {box: 3.0}}\n",  # unset, then set: the mapping is replaced, not merged
    )
    cfg = load_config(child)
    assert "dropout" not in cfg.model.args and cfg.model.args["width"] == 16  # the builder's default applies
    assert cfg.optim.clip_norm is None  # OptimConfig's default
    assert cfg.model.loss_weights == {"box": 3.0}  # cls (in the base) is gone


def test_unset_of_a_key_the_chain_does_not_set_or_without_a_base_is_an_error(tmp_path):
    smoke_base(tmp_path)
    typo = write(tmp_path / "typo.yaml", "base: smoke_base.yaml\nunset: [model.args.dropuot]\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: unset: model\.args\.dropuot: the base chain does not set it"):
        load_config(typo)
    alone = write(tmp_path / "alone.yaml", SMOKE.read_text() + "unset: [optim.lr]\n")
    with pytest.raises(ConfigError, match=r"alone\.yaml: unset: needs a base"):
        load_config(alone)
    bad = write(tmp_path / "bad.yaml", "base: smoke_base.yaml\nunset: {optim: lr}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: unset: expected a list of dotted keys"):
        load_config(bad)


# ---------------------------------------------------------------------- errors name the file
def test_an_unknown_key_or_bad_value_names_the_file_of_the_chain_that_set_it(tmp_path):
    write(tmp_path / "base.yaml", SMOKE.read_text().replace("  lr: 1.0e-2\n", "  lrr: 1.0e-2\n"))
    child = write(tmp_path / "child.yaml", "base: base.yaml\ntrain: {steps: 5}\n")
    with pytest.raises(ConfigError) as err:
        load_config(child)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'base.yaml'} (a base of {child}): optim.lrr: unknown key"), message
    assert message.endswith(f"; {child} drops what its bases set there with `unset: [optim]` (docs/engine.md)")
    assert "\n" not in message

    smoke_base(tmp_path)
    own = write(tmp_path / "own.yaml", "base: smoke_base.yaml\noptim: {lr: fast}\n")
    with pytest.raises(ConfigError, match=rf"^{own}: optim\.lr: expected a number"):
        load_config(own)
    nested = write(tmp_path / "nested.yaml", "base: smoke_base.yaml\noptim: {groups: [{modules: [], lr_mult: 1}]}\n")
    with pytest.raises(ConfigError, match=rf"^{nested}: optim\.groups\[\]\.modules: must name at least one module"):
        load_config(nested)
    unknown_section = write(tmp_path / "section.yaml", "base: smoke_base.yaml\nplugins: [os]\n")
    with pytest.raises(ConfigError, match=rf"^{unknown_section}: plugins: unknown key"):
        load_config(unknown_section)


def test_overrides_apply_after_the_chain_and_their_errors_name_the_override_not_a_file(tmp_path):
    smoke_base(tmp_path)
    child = write(tmp_path / "child.yaml", "base: smoke_base.yaml\noptim: {lr: 0.5}\n")
    assert load_config(child, ["optim.lr=0.125"]).optim.lr == 0.125  # over the child's value
    assert load_config(child, ["optim.clip_norm=2.0"]).optim.clip_norm == 2.0  # over the base's
    with pytest.raises(ConfigError, match=r"^override optim\.clip_norm=big: optim\.clip_norm: expected a number"):
        load_config(child, ["optim.clip_norm=big"])  # the base set clip_norm, the override broke it
    with pytest.raises(ConfigError, match=r"^override optim\.lrr=1e-3: optim\.lrr: unknown key"):
        load_config(child, ["optim.lrr=1e-3"])  # typed on the command line: no file of the chain holds it
    section = "optim.groups=[{modules: [backbone], lr_mul: 2}]"  # a key inside a section an override replaced
    with pytest.raises(ConfigError, match=rf"^override {re.escape(section)}: optim\.groups\[0\]\.lr_mul"):
        load_config(child, [section])
    bad = write(tmp_path / "bad.yaml", "base: smoke_base.yaml\noptim: {lr: fast}\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: optim\.lr: expected a number"):  # the file's own key
        load_config(bad, ["optim.clip_norm=1"])


def test_a_config_naming_another_model_than_its_base_is_told_to_unset_the_bases_args(tmp_path):
    """A config built on a shipped one with another model: the base's model.args are not the new model's; the error
    says how to drop them, and that works (docs/design.md's plugin config)."""
    base = os.path.relpath(CONFIGS / "pointpillars_tiny.yaml", tmp_path)
    other = write(tmp_path / "other.yaml", f"base: {base}\nmodel: {{name: streampetr}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(other)
    assert re.fullmatch(
        rf".*\.yaml \(a base of {re.escape(str(other))}\): model\.args\.\w+: unknown .*; "
        rf"{re.escape(str(other))} drops what its bases set there with `unset: \[model\.args\]` \(docs/engine\.md\)",
        str(err.value),
    ), err.value
    fixed = write(tmp_path / "fixed.yaml", other.read_text() + "unset: [model.args]\n")
    assert load_config(fixed).model.name == "streampetr"


def test_a_loop_is_refused_with_the_chain_named(tmp_path):
    (tmp_path / "here").symlink_to(tmp_path, target_is_directory=True)
    a = write(tmp_path / "a.yaml", "base: b.yaml\nrun: {seed: 1}\n")
    write(tmp_path / "b.yaml", "base: here/a.yaml\nrun: {seed: 2}\n")  # a.yaml by another name
    with pytest.raises(ConfigError, match=r"a\.yaml: base: the chain loops: .*a\.yaml → .*b\.yaml → .*here/a\.yaml$"):
        load_config(a)
    itself = write(tmp_path / "self.yaml", "base: self.yaml\nrun: {seed: 1}\n")
    with pytest.raises(ConfigError, match=r"self\.yaml: base: the chain loops: .*self\.yaml → .*self\.yaml"):
        load_config(itself)


def test_a_chain_deeper_than_the_limit_is_refused(tmp_path):
    smoke_base(tmp_path)
    write(tmp_path / "c0.yaml", "base: smoke_base.yaml\nrun: {seed: 0}\n")
    for i in range(1, MAX_BASE_DEPTH + 1):
        write(tmp_path / f"c{i}.yaml", f"base: c{i - 1}.yaml\nrun: {{seed: {i}}}\n")
    deepest_allowed = tmp_path / f"c{MAX_BASE_DEPTH - 1}.yaml"  # c0 … c15 and the smoke base: 16 bases
    assert len(read_config_file(deepest_allowed).chain) == MAX_BASE_DEPTH + 1
    assert load_config(deepest_allowed).run.seed == MAX_BASE_DEPTH - 1
    with pytest.raises(ConfigError, match=rf"c{MAX_BASE_DEPTH}\.yaml: base: the chain is deeper than {MAX_BASE_DEPTH}"):
        load_config(tmp_path / f"c{MAX_BASE_DEPTH}.yaml")


def test_a_missing_base_is_named_with_the_file_that_names_it(tmp_path):
    child = write(tmp_path / "proj" / "child.yaml", "base: ../shared/gone.yaml\nrun: {seed: 1}\n")
    gone = tmp_path / "shared" / "gone.yaml"
    with pytest.raises(ConfigError, match=rf"^{gone} \(the base of {child}\): config file not found$"):
        load_config(child)
    write(gone, "run: [not, a, mapping]\nkey: : :\n")
    with pytest.raises(ConfigError, match=rf"^{gone} \(the base of {child}\): not valid YAML"):
        load_config(child)


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ("/etc/drivetrain/base.yaml", "an absolute path is refused; write it relative to this file's folder"),
        ("~/configs/base.yaml", "an absolute path is refused"),
        ("base.py", "a base must be a .yaml or .yml file"),
        ("notes.txt", "a base must be a .yaml or .yml file"),
        ("../../.ssh/id_rsa", "a base must be a .yaml or .yml file"),
        ("[a.yaml, b.yaml]", "base: expected the relative path of one YAML file, got list"),
        ("''", "base: expected the relative path of one YAML file, got str ''"),
        ("3", "base: expected the relative path of one YAML file, got int 3"),
    ],
)
def test_absolute_and_non_yaml_bases_are_refused(tmp_path, base, message):
    child = write(tmp_path / "child.yaml", f"base: {base}\nrun: {{seed: 1}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(child)
    assert str(err.value).startswith(f"{child}: base: ") and message in str(err.value), err.value
    assert "\n" not in str(err.value)


def test_a_yml_base_anywhere_the_user_can_read_is_allowed(tmp_path):
    """A project's config extends a shipped one by a relative path that leaves its folder (``..``)."""
    write(tmp_path / "shared" / "base.yml", SMOKE.read_text())
    child = write(tmp_path / "proj" / "deep" / "child.yaml", "base: ../../shared/base.yml\ntrain: {steps: 9}\n")
    assert load_config(child).train.steps == 9


# ---------------------------------------------------------------------- run directory, resume, printing
def test_the_run_keeps_the_resolved_config_and_resumes_without_its_base(tmp_path):
    base = smoke_base(tmp_path / "shared")
    out = tmp_path / "run"
    child = write(tmp_path / "proj" / "child.yaml", "base: ../shared/smoke_base.yaml\noptim: {lr: 0.005}\n")
    cfg = load_config(child, overrides(out, "train.steps=2", "checkpoint.every=2"))
    Trainer(cfg).fit()
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved == config_to_dict(cfg) and "base" not in saved and saved["optim"]["lr"] == 0.005
    base.unlink()
    child.unlink()
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(child)
    # the run directory's config.yaml is complete: the run continues from it (a changed config would be refused)
    resumed = Trainer(load_config(out / "config.yaml", ["train.steps=4"]), resume="auto")
    assert resumed.state.iteration == 2
    state = resumed.fit()
    resumed.close()
    assert state.iteration == 4


def test_print_config_prints_the_resolved_config_and_creates_nothing(tmp_path, capsys):
    smoke_base(tmp_path)
    child = write(tmp_path / "child.yaml", "base: smoke_base.yaml\noptim: {lr: 0.5}\n")
    out = tmp_path / "never"
    argv = ["train", "--config", str(child), "--print-config", f"run.out_dir={out}", "train.steps=3"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert not out.exists()
    assert f"# base chain: {child} → {tmp_path / 'smoke_base.yaml'}" in printed
    assert f"# overrides: run.out_dir={out} train.steps=3" in printed
    flat = write(tmp_path / "flat.yaml", printed)  # a complete config: the same run without the base
    assert load_config(flat) == load_config(child, [f"run.out_dir={out}", "train.steps=3"])
    assert load_config(flat).optim.lr == 0.5 and load_config(flat).train.steps == 3

    assert main(["train", "--config", str(child), "--print-config", "optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drivetrain train: config error: override optim.lrr=1: optim.lrr: unknown key; known keys: ")
    assert err.count("\n") == 1  # one line
    assert main(["tune", "loader", "--config", str(child), "--print-config"]) == 0  # tune loader takes --config too
    assert "optim:\n  lr: 0.5\n" in capsys.readouterr().out


# ---------------------------------------------------------------------- the shipped configs
SHIPPED = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(PREFOLD), ids=str)
def test_every_shipped_config_resolves_to_what_it_said_before_the_fold(name):
    assert read_config_file(CONFIGS / name).data == PREFOLD[name]


def test_the_shipped_configs_are_folded_onto_shared_bases():
    chains = {p.stem: [c.name for c in read_config_file(p).chain[1:]] for p in SHIPPED}
    assert chains["voxelnet_tiny"] == ["pointpillars_tiny.yaml", "lidar_tiny.yaml"]
    assert chains["ssn_tiny"] == chains["pointpillars_tiny"] == ["lidar_tiny.yaml"]
    assert chains["ssn_nus"] == chains["pointpillars_nus"] == ["lidar_nus.yaml"]
    assert chains["streampetr_tiny_aug"] == chains["streampetr_tiny_long"] == ["streampetr_tiny.yaml"]
    assert chains["streampetr_full_aug"] == ["streampetr_full.yaml"]


def test_drivetrain_configs_lists_every_shipped_config_with_its_purpose_and_base(capsys):
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == {p.stem for p in SHIPPED}
    for path in SHIPPED:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# ") and len(first) <= 120, f"{path.name}: the first line is its purpose"
        assert rows[path.stem].endswith(first[2:]), rows[path.stem]
    assert rows["voxelnet_tiny"].split()[1] == "pointpillars_tiny.yaml"
    assert rows["ssn_nus"].split()[1] == "_base/lidar_nus.yaml"
    assert rows["smoke"].split()[1] == "-"


def test_drivetrain_configs_name_prints_one_resolved_and_an_unknown_name_lists_the_known(tmp_path, capsys):
    assert main(["configs", "voxelnet_tiny", "optim.lr=2e-3"]) == 0
    printed = capsys.readouterr().out
    assert "# base chain: " in printed and "_base/lidar_tiny.yaml" in printed
    flat = write(tmp_path / "flat.yaml", printed)
    assert load_config(flat) == load_config(CONFIGS / "voxelnet_tiny.yaml", ["optim.lr=2e-3"])
    assert main(["configs", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drivetrain configs: nosuch: no such config (known: ") and "ssn_tiny" in err
    write(tmp_path / "mine" / "a.yaml", "# my own config\nbase: ../flat.yaml\n")
    assert main(["configs", "--dir", str(tmp_path / "mine")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split() == ["a", "../flat.yaml", "my", "own", "config"]
