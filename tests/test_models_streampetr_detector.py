"""The StreamPETR detector end to end on synthetic frames: output shapes of both configs (the full one in the slow set),
the batched and the reference loss paths agree on the model's real outputs (terms and parameter gradients), the batched
training step reads nothing on the host outside the two solver calls, it learns two frames, the temporal memory resets
at a scene start and survives a checkpoint mid-scene bit-exactly, and ``detect`` decodes at most 300 boxes."""

from __future__ import annotations

import copy
import dataclasses
import io
from pathlib import Path

import pytest
import torch
import yaml

import drivetrain.match.assigners as assigners_module
from drivetrain.data.sources import frames
from drivetrain.losses.term_weights import weighted_total
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.args import StreamPETRArgs
from drivetrain.models.streampetr.denoising import make_dn_queries, reference_make_dn_queries
from drivetrain.models.streampetr.loss import BATCHED, REFERENCE
from drivetrain.models.streampetr.recipe import POST_CENTER_RANGE
from helpers.nosync import allow_host_sync, no_host_sync
from helpers.streampetr import SMALL

ROOT = Path(__file__).resolve().parents[1]


def config_args(size: str) -> dict:
    return yaml.safe_load((ROOT / "configs" / f"streampetr_{size}.yaml").read_text())["model"]["args"]


@pytest.fixture(scope="module")
def train_frames(synth_index, synth_root):
    """2 mini_train scenes × 3 frames (160×90): frames 0 and 3 start a scene."""
    return frames(str(synth_root / "drivetrain_index.npz"), split="mini_train")


def batch_of(ds, *keys):
    return ds.collate([ds[k] for k in keys])


def model_of(args: dict, seed: int = 0, **overrides) -> StreamPETR:
    torch.manual_seed(seed)
    return StreamPETR(**{**args, **overrides})


def total_loss(model: StreamPETR, outputs: dict, batch) -> torch.Tensor:
    return weighted_total(model.loss(outputs, batch), model.loss_weights)


def check_shapes(model: StreamPETR, batch, layers: int, queries: int) -> None:
    b, n = batch.images.shape[:2]
    outputs = model(batch)
    assert outputs["cls_logits"].shape == (layers, b, queries, 10)
    assert outputs["box_codes"].shape == (layers, b, queries, 10)
    p = outputs["dn_cls_logits"].shape[2]
    assert p > 0 and outputs["dn_box_codes"].shape == (layers, b, p, 10) and outputs["dn_background"].shape == (b, p)
    w, h = outputs["padded_size"]
    assert (w % 32, h % 32) == (0, 0) and (w, h) == (160, 96)
    focal = outputs["focal"]
    fh, fw = h // model.stride, w // model.stride
    assert focal["cls_logits"].shape == (b, n, fh * fw, 10) and focal["boxes"].shape == (b, n, fh * fw, 4)
    assert focal["centerness"].shape == (b, n, fh, fw)
    terms = model.loss(outputs, batch)
    assert {"loss_cls", "loss_bbox", "dn_loss_cls", "dn_loss_bbox", "enc_loss_cls", "centerness_loss"} <= set(terms)
    assert all(v.ndim == 0 and torch.isfinite(v) for v in terms.values())
    model.eval()
    outputs = model(batch)
    assert outputs["cls_logits"].shape == (layers, b, queries, 10) and "dn_cls_logits" not in outputs


def test_tiny_config_forward_shapes_in_training_and_eval(train_frames):
    args = config_args("tiny")
    model = model_of(args)
    check_shapes(model, batch_of(train_frames, 0, 3), args["num_layers"], args["num_query"] + args["num_propagated"])


# ~4 s; the shapes: the tiny config's test above; the published model builds (ResNet-50 trunk) and loads:
# tests/test_engine_init_from.py
@pytest.mark.slow
def test_full_config_forward_shapes_at_batch_one(train_frames):
    args = config_args("full")
    model = model_of(args)
    assert type(model.backbone.trunk).__name__ == "ResNet50"
    check_shapes(model, batch_of(train_frames, 0), args["num_layers"], args["num_query"] + args["num_propagated"])


def test_loss_paths_agree_on_the_models_outputs_terms_and_gradients(train_frames):
    model = model_of(SMALL).train()
    batch = batch_of(train_frames, 0, 3)
    outputs = model(batch)
    leaves = {k: v for k, v in outputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    assert set(leaves) == {"cls_logits", "box_codes", "dn_cls_logits", "dn_box_codes"}
    inputs = [*leaves.values(), *outputs["focal"].values()]  # everything the two criteria read
    results = {}
    for impl in ("reference", "batched"):
        terms = model_of(SMALL, impl=impl).loss(outputs, batch)  # the path is chosen when the model is built
        grads = torch.autograd.grad(weighted_total(terms, model.loss_weights), inputs, retain_graph=True)
        results[impl] = terms, grads
    (ref_terms, ref_grads), (bat_terms, bat_grads) = results["reference"], results["batched"]
    # The losses compute in float32 (mmdet's force_fp32) and each term sums non-negative elements, in another
    # order on each path: the relative difference is at most (n − 1)·u for n summands (u = eps/2), n ≤ the
    # largest output's element count.
    u = torch.finfo(torch.float32).eps / 2
    n = max(t.numel() for t in inputs)
    assert ref_terms.keys() == bat_terms.keys()
    for key, value in ref_terms.items():
        torch.testing.assert_close(bat_terms[key], value, rtol=n * u, atol=0.0, msg=key)
    # Gradients of the outputs (the rest of backward is the same graph on both paths): each element is the same
    # short chain (≤ 16 float32 operations) of elementwise functions whose vectorised and scalar kernels may
    # differ by an ulp each, so 16 ulps relative; atol scales that to the tensor's largest gradient for
    # elements that come out of a cancellation (p − t).
    for name, ref, bat in zip([*leaves, *outputs["focal"]], ref_grads, bat_grads, strict=True):
        assert ref.abs().max() > 0, name
        torch.testing.assert_close(bat, ref, rtol=16 * u, atol=16 * u * float(ref.abs().max()), msg=name)


def test_training_step_syncs_only_for_dn_shapes_and_the_two_solver_calls(train_frames, monkeypatch):
    """Three documented syncs per step: the denoising queries' shapes (``S``, ``T``), the 3D head's one solver
    call (every decoder layer and sample) and the focal head's (every image)."""
    model = model_of(SMALL).train()
    batch = batch_of(train_frames, 0, 3)
    model(batch)  # first call: drivetrain.constants caches its per-device constants
    calls = []

    def allowed(name, fn):
        def run(*args, **kwargs):
            calls.append(name)
            with allow_host_sync():
                return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(assigners_module, "solve", allowed("solve", assigners_module.solve))
    dn = allowed("dn", model.path.make_dn_queries)  # the builder of the path the model chose
    monkeypatch.setattr(model, "path", dataclasses.replace(model.path, make_dn_queries=dn))
    with no_host_sync():
        total_loss(model, model(batch), batch).backward()
    assert calls == ["dn", "solve", "solve"]


def test_twenty_steps_on_two_frames_drive_the_loss_down(train_frames):
    # A clear margin: a quarter off in 20 steps (a detached or mis-signed gradient leaves it at ~1×).
    model = model_of(SMALL, dropout=0.0).train()
    batch = batch_of(train_frames, 0, 3)  # two scene starts: the memory resets every step
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    losses = []
    for _ in range(20):
        torch.manual_seed(1)  # the same denoising noise every step
        loss = total_loss(model, model(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 35.0)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.75 * losses[0], losses


def test_a_scene_start_clears_the_memory_exactly(train_frames):
    model = model_of(SMALL).eval()
    fresh = copy.deepcopy(model)
    model(batch_of(train_frames, 0))
    model(batch_of(train_frames, 1))  # the memory now holds scene 1's frames
    assert model.memory.get_extra_state()["embedding"].abs().sum() > 0
    start = batch_of(train_frames, 3)  # another scene's first frame: prev_exists False
    assert not start.prev_exists.any()
    a, b = model(start), fresh(start)
    torch.testing.assert_close(a["cls_logits"], b["cls_logits"], rtol=0, atol=0)
    torch.testing.assert_close(a["box_codes"], b["box_codes"], rtol=0, atol=0)
    # Continuing the scene uses the memory: the same frame with prev_exists True decodes differently.
    c = model(batch_of(train_frames, (4, True)))
    d = fresh(batch_of(train_frames, (4, False)))
    assert not torch.equal(c["cls_logits"], d["cls_logits"])


def test_a_checkpoint_mid_scene_resumes_the_stream_bit_exactly(train_frames):
    model = model_of(SMALL).eval()
    model(batch_of(train_frames, 0))
    model(batch_of(train_frames, 1))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    resumed = model_of(SMALL, seed=7).eval()  # other weights, empty memory: everything comes from the file
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    nxt = batch_of(train_frames, 2)
    assert nxt.prev_exists.all()
    a, b = model(nxt), resumed(nxt)
    torch.testing.assert_close(b["cls_logits"], a["cls_logits"], rtol=0, atol=0)
    torch.testing.assert_close(b["box_codes"], a["box_codes"], rtol=0, atol=0)
    for key, value in model.memory.get_extra_state().items():
        assert torch.equal(resumed.memory.get_extra_state()[key], value), key


def test_detect_decodes_at_most_300_boxes_by_descending_score(train_frames):
    model = model_of(SMALL).eval()
    boxes, scores, labels = model.detect(batch_of(train_frames, 0, 3))
    assert boxes.tensor.shape[:2] == scores.tensor.shape == labels.tensor.shape
    assert boxes.tensor.shape[-1] == 9 and scores.tensor.shape[1] <= 300
    assert int(scores.sizes.max()) == 300  # (48 + 8 queries) × 10 classes ≥ 300 before the range filter
    low, high = torch.tensor(POST_CENTER_RANGE[:3]), torch.tensor(POST_CENTER_RANGE[3:])
    for i in range(2):
        k = int(scores.sizes[i])
        s = scores.tensor[i, :k]
        assert torch.all(s[:-1] >= s[1:]) and torch.all((s >= 0) & (s <= 1))
        assert torch.all((labels.tensor[i, :k] >= 0) & (labels.tensor[i, :k] < 10))
        centres = boxes.tensor[i, :k, :3]
        assert torch.all((centres >= low) & (centres <= high))
    few = model.detect(batch_of(train_frames, 1, 4), max_num=5)[1]  # the next frames of both scenes
    assert int(few.sizes[0]) <= 5


def test_misuse_is_named(train_frames):
    model = model_of(SMALL)
    batch = batch_of(train_frames, 0)
    with pytest.raises(ValueError, match=r"batch\.images"):
        model(dataclasses.replace(batch, images=None))
    with pytest.raises(ValueError, match="impl: expected 'batched' or 'reference', got 'fast'"):
        StreamPETR(**{**SMALL, "impl": "fast"})
    with pytest.raises(ValueError, match="embed_dims: must be even"):
        StreamPETR(**{**SMALL, "embed_dims": 33})


def test_the_args_object_builds_the_model_and_keywords_replace_its_fields():
    args = StreamPETRArgs(**SMALL)
    model = StreamPETR(args, num_query=20)
    assert model.args == dataclasses.replace(args, num_query=20)
    assert model.reference_points.num_embeddings == 20 and len(model.decoder.layers) == SMALL["num_layers"]
    with pytest.raises(TypeError, match="num_querys"):
        StreamPETR(args, num_querys=20)


def test_the_path_is_chosen_once_when_the_model_is_built():
    assert model_of(SMALL).path is BATCHED
    assert model_of(SMALL, impl="reference").path is REFERENCE
    assert REFERENCE.make_dn_queries is reference_make_dn_queries and BATCHED.make_dn_queries is make_dn_queries
