"""``drivetrain.batch.Batch``: a name it lacks is an error that names the field, the close ones and every field, and
is still an ``AttributeError`` (``hasattr``, ``getattr`` with a default, copying)."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import typing

import pytest
import torch

from drivetrain.batch import Batch, BatchFieldError, Encoded
from drivetrain.engine.protocol import FrozenEncoder


@pytest.fixture(scope="module")
def batch(synth_index, synth_root) -> Batch:
    from drivetrain.data.sources import frames

    dataset = frames(str(synth_root / "drivetrain_index.npz"), str(synth_root), "mini_val", load_images=False)
    return dataset.collate([dataset[0], dataset[1]])


def test_a_misspelt_field_names_the_close_fields_and_every_field(batch):
    with pytest.raises(BatchFieldError) as info:
        batch.gt_box  # noqa: B018 - the read is the test
    message = str(info.value)
    assert message.startswith("Batch has no field 'gt_box' (did you mean gt_boxes or gt_boxes_2d?); its fields ")
    assert "gt_labels" in message and "points" in message and info.value.name == "gt_box"
    with pytest.raises(BatchFieldError, match=r"^Batch has no field 'zzz'; its fields"):  # nothing close: no guess
        batch.zzz  # noqa: B018


def test_it_is_still_an_attribute_error(batch):
    assert not hasattr(batch, "gt_box") and getattr(batch, "gt_box", None) is None
    assert isinstance(BatchFieldError("x"), AttributeError)
    assert hasattr(batch, "gt_boxes") and batch.batch_size == 2  # fields and members as before
    again = copy.deepcopy(batch)  # probes optional dunders (__deepcopy__, __setstate__) as pickling does
    assert again.sample_tokens == batch.sample_tokens and again.gt_boxes.tensor.equal(batch.gt_boxes.tensor)


def test_no_field_is_any_and_the_encoder_output_has_the_type_the_model_declares(batch):
    """``encoded`` (a model's encoder output computed ahead) is typed by the model: ``Batch[E]``, with ``E`` what its
    ``FrozenEncoder[E].encode`` returns; the engine carries it without knowing ``E``, and no field is ``Any``."""
    hints = typing.get_type_hints(Batch)
    assert typing.Any not in hints.values()
    assert hints["encoded"] == Encoded | None and Batch.__parameters__ == (Encoded,)
    assert typing.get_type_hints(FrozenEncoder.encode)["return"] is Encoded and FrozenEncoder.__parameters__ == (
        Encoded,
    )
    features: tuple[torch.Tensor, tuple[int, int]] = (torch.zeros(2, 4, 3, 5), (80, 48))
    ahead = dataclasses.replace(batch, encoded=features)  # what the trainer does (engine.train_batches)
    assert ahead.encoded is features and batch.encoded is None
    again = pickle.loads(pickle.dumps(ahead))  # loader workers pickle batches
    assert again.encoded[1] == (80, 48) and again.encoded[0].equal(features[0])
