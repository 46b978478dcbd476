"""The update taken before the host knows whether to keep it: kept, it is ``optimizer.step()`` bit for bit; undone,
parameters and optimizer state are exactly as before (also over NaN gradients), and a first update leaves no state."""

from __future__ import annotations

import copy

import torch

from drivetrain.engine.undoable_update import UndoableUpdate


def _setup() -> tuple[torch.nn.Module, torch.optim.AdamW]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model[2].bias.requires_grad_(False)  # a parameter the optimizer has no gradient for
    return model, _adamw(model)


def _adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)


def _backward(model: torch.nn.Module, scale: float = 1.0) -> None:
    model.zero_grad(set_to_none=True)
    (model(torch.randn(5, 4)).square().sum() * scale).backward()


def _bits(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [v for s in optimizer.state.values() for v in s.values()]
    return [t.detach().clone().view(-1).view(torch.uint8) for t in [*model.parameters(), *state]]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_kept_update_is_the_optimizers_step_bit_for_bit():
    model, optimizer = _setup()
    twin = copy.deepcopy(model)
    twin_optimizer = _adamw(twin)
    update = UndoableUpdate(optimizer)
    for _ in range(3):
        torch.manual_seed(1)
        _backward(model)
        torch.manual_seed(1)
        _backward(twin)
        update.step()
        update.settle(True)
        twin_optimizer.step()
    assert _same(_bits(model, optimizer), _bits(twin, twin_optimizer))


def test_an_undone_update_leaves_every_value_and_the_state_as_it_was():
    model, optimizer = _setup()
    update = UndoableUpdate(optimizer)
    _backward(model)
    update.step()
    update.settle(False)  # the first update undone: no state at all, as if it never stepped
    assert len(optimizer.state) == 0 and optimizer.state_dict()["state"] == {}
    _backward(model)
    update.step()
    update.settle(True)
    before, steps = _bits(model, optimizer), [s["step"].item() for s in optimizer.state.values()]
    _backward(model, scale=float("nan"))  # NaN gradients: the update writes NaNs everywhere
    update.step()
    assert any(p.isnan().any() for p in model.parameters())
    update.settle(False)
    assert _same(_bits(model, optimizer), before)
    assert [s["step"].item() for s in optimizer.state.values()] == steps == [1.0] * 3  # the 3 with gradients
