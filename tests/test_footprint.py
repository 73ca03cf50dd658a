"""gptblock.model.footprint: the memory estimate, against the parameter count of the built model and
the peak memory the profiler measures for a real training step."""

import pytest
import torch

from gptblock import GPT, GPTConfig, UserError
from gptblock.bench.measure import profile_call
from gptblock.devices import available_memory
from gptblock.model.footprint import (
    MemoryEstimate,
    check_memory,
    parameter_count,
    train_memory,
)
from gptblock.train.config import TrainConfig, configure_optimizer

CONFIGS = [
    dict(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64),
    dict(vocab_size=200, block_size=32, n_layer=1, n_head=2, n_embd=32, bias=False),
    dict(vocab_size=65, block_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.2),
    dict(vocab_size=65, block_size=64, n_layer=2, n_head=2, n_embd=64, block="mha"),
    dict(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32, block="mha", dropout=0.1),
    dict(vocab_size=65, block_size=64, n_layer=2, n_head=2, n_embd=64, block="lesson", activation="relu"),
    dict(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=32, block="lesson", activation="relu", dropout=0.2),
    dict(vocab_size=65, block_size=32, n_layer=1, n_head=2, n_embd=256),  # parameters dominate
]  # fmt: skip


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_the_parameter_count_is_the_built_models(kwargs):
    config = GPTConfig(**kwargs)
    assert parameter_count(config) == sum(p.numel() for p in GPT(config).parameters())


def measured_step_peak(config, B):
    """Peak bytes above the start of a second training step (AdamW's moments exist by then),
    with the weights, moments and lesson buffers that exist before it: what a run holds."""
    torch.manual_seed(0)
    model = GPT(config)
    opt = configure_optimizer(model, TrainConfig())
    x = torch.randint(0, config.vocab_size, (B, config.block_size))

    def step():
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # as the trainer does

    step()
    peak, _ = profile_call(step, torch.device("cpu"))
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    held -= model.lm_head.weight.numel() * 4  # tied: one tensor, listed twice
    held += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    return peak + held


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_the_estimate_is_within_its_stated_error_of_a_measured_step(kwargs):
    config, B = GPTConfig(**kwargs), 8
    estimate = train_memory(config, B).total
    measured = measured_step_peak(config, B)
    assert 0.8 * measured <= estimate <= 1.35 * measured, (estimate, measured)


def test_the_parts_add_up_and_the_data_is_counted():
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)
    bare, with_text = train_memory(config, 8), train_memory(config, 8, characters=1000)
    assert isinstance(bare, MemoryEstimate) and bare.data == 0
    assert (
        with_text.total - bare.total == with_text.data == 20_000
    )  # 8 bytes an id, 12 at encoding's peak
    assert bare.weights == bare.optimizer == 8 * bare.parameters


def test_available_memory_is_a_plausible_number_on_the_cpu():
    free = available_memory("cpu")
    assert free is None or 2**20 < free < 2**50
    assert available_memory("meta") is None


def test_check_memory_refuses_naming_the_numbers(monkeypatch):
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)
    import gptblock.model.footprint as fp

    monkeypatch.setattr(fp, "available_memory", lambda device: 2**20)
    with pytest.raises(UserError, match=r"needs about .* MiB .* but cpu has 1.0 MiB available"):
        check_memory(config, 64, 0, "cpu")
    monkeypatch.setattr(fp, "available_memory", lambda device: 2**40)
    assert check_memory(config, 64, 0, "cpu").total < 2**40
