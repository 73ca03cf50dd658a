"""The trainer, on a stand-in bigram model: schedule, optimizer, losses, checkpoints, resume."""

import contextlib
import itertools
import math
import os
import signal
import sys
import warnings

import pytest
import torch
from torch.nn import functional as F

import gptblock
from gptblock.data.batches import split_tokens
from gptblock.devices import autocast_context
from gptblock.runs.checkpoint import CheckpointError, load_checkpoint
from gptblock.train.config import TrainConfig, configure_optimizer, lr_at
from gptblock.train.loop import Trainer
from gptblock.train.result import NonFiniteLossError
from standin import Bigram, pattern_tokens

V = 7


def data(n=700):
    return split_tokens(pattern_tokens(n, V), block_size=8)


def config(**overrides):
    base = dict(
        block_size=8,
        batch_size=4,
        max_iters=12,
        lr=0.05,
        warmup=2,
        eval_interval=4,
        eval_iters=2,
        seed=0,
    )
    return TrainConfig(**{**base, **overrides})


def model(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return Bigram(V, dropout=dropout)


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(lr=6e-4, min_lr_ratio=0.1, warmup=10, max_iters=110)
    lrs = [lr_at(s, cfg) for s in range(cfg.max_iters + 1)]
    # Warmup: linear, reaching the peak on the last warmup step.
    assert lrs[:10] == pytest.approx([6e-4 * (s + 1) / 10 for s in range(10)], rel=1e-12)
    # Decay: the half cosine, independently written as a sine of the remaining fraction.
    for s in range(10, 111):
        remaining = (110 - s) / 100
        expected = 6e-5 + (6e-4 - 6e-5) * math.sin(math.pi * remaining / 2) ** 2
        assert lrs[s] == pytest.approx(expected, rel=1e-12, abs=1e-18)
    assert lrs[10] == pytest.approx(6e-4) and lrs[110] == pytest.approx(6e-5)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lr_at(500, cfg) == pytest.approx(6e-5)
    assert lr_at(0, TrainConfig(warmup=0, max_iters=10)) == pytest.approx(1e-3)


def test_weight_decay_applies_to_matrices_only():
    m = model()
    opt = configure_optimizer(m, config(lr=0.1, weight_decay=0.5))
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert decayed == {id(m.wte.weight), id(m.head.weight)}
    assert {id(p) for p in opt.param_groups[1]["params"]} == {id(m.head.bias)}
    # With zero gradients AdamW's only change is the decay: p <- p * (1 - lr * wd).
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in m.named_parameters():
        factor = 1 - 0.1 * 0.5 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[name] * factor, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
        ({"lr": 0.0}, r"lr must be in \(0, 10\], got 0.0"),
        ({"lr": float("nan")}, r"lr must be in \(0, 10\], got nan"),
        ({"warmup": -1}, "warmup must be an int >= 0, got -1"),
        ({"beta2": 1.5}, r"beta2 must be in \[0, 1\), got 1.5"),
        ({"dtype": "half"}, "dtype must be one of"),
        ({"compile": 1}, "compile must be a bool"),
    ],
)
def test_train_config_is_validated(overrides, match):
    with pytest.raises((ValueError, TypeError), match=match):
        config(**overrides)


def test_training_lowers_the_loss_and_saves_everything(tmp_path):
    trainer = Trainer(
        model(), data(), config(max_iters=40, lr=0.1), out_dir=tmp_path, progress=False
    )
    result = trainer.fit()
    first, last = trainer.evals[0], trainer.evals[-1]
    assert (first["step"], last["step"]) == (0, 40)
    assert last["val"] < first["val"] - 0.5
    assert result.step == 40 and not result.interrupted and len(trainer.losses) == 40
    assert result.best_val_loss == min(e["val"] for e in trainer.evals)
    assert load_checkpoint(tmp_path, "last").meta["step"] == 40
    best_step = min(trainer.evals, key=lambda e: e["val"])["step"]
    assert load_checkpoint(tmp_path, "best").meta["step"] == best_step
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    suffixes = sorted(p.suffix for p in tmp_path.iterdir())
    assert suffixes == [
        ".json",
        ".json",
        ".lock",
        ".png",
        ".safetensors",
        ".safetensors",
        ".written",
    ]


def test_whole_validation_loss_matches_the_pairwise_oracle():
    # A bigram model's loss ignores context, so the whole-split loss is the plain mean of
    # cross-entropy over consecutive pairs, however the split is cut into windows.
    splits = data(n=1003)  # a validation part that is not a multiple of block_size
    m = model()
    trainer = Trainer(m, splits, config(batch_size=3), progress=False)
    val = splits.val
    with torch.no_grad():
        logits, _ = m(val[None, :-1])  # (1, N - 1, V)
        expected = F.cross_entropy(logits[0].double(), val[1:]).item()
    assert trainer.validation_loss() == pytest.approx(expected, rel=1e-6)


def test_loss_estimates_are_repeatable_and_leave_training_randomness_alone():
    trainer = Trainer(model(dropout=0.5), data(), config(), progress=False)
    rng, gen = torch.get_rng_state(), trainer.generator.get_state()
    first = trainer.estimate_loss()
    assert trainer.estimate_loss() == first
    assert torch.equal(torch.get_rng_state(), rng) and torch.equal(
        trainer.generator.get_state(), gen
    )
    assert trainer.model.training  # evaluation restores the mode


def stop_at(k):
    def callback(trainer):
        if trainer.iter_num == k:
            trainer.request_stop()

    return callback


def run_stopped_and_resumed(tmp_path, k, dropout):
    first = Trainer(model(dropout=dropout), data(), config(), out_dir=tmp_path, progress=False)
    first.add_callback("on_step_end", stop_at(k))
    stopped = first.fit()
    assert stopped.interrupted and stopped.step == k and stopped.val_loss is None
    assert load_checkpoint(tmp_path).meta["step"] == k
    torch.manual_seed(12345)  # whatever the global RNG holds now must not matter
    second = Trainer(
        model(seed=99, dropout=dropout), data(), config(), out_dir=tmp_path, progress=False
    )
    second.fit(resume=True)
    return second


@pytest.mark.parametrize("k", [5, 8])  # between evaluations, and on one
def test_resume_is_bit_exact(tmp_path, k):
    whole = Trainer(model(dropout=0.3), data(), config(), progress=False)
    whole.fit()
    resumed = run_stopped_and_resumed(tmp_path, k, dropout=0.3)
    for name, p in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], p), name
    assert resumed.losses == whole.losses and resumed.evals == whole.evals
    a, b = whole.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(a[i][key], b[i][key]) for i in a for key in a[i])


def test_resume_without_the_saved_rng_would_differ(tmp_path, monkeypatch):
    # The control for the test above: with dropout on, the saved RNG state is what makes the
    # resumed run exact.
    whole = Trainer(model(dropout=0.3), data(), config(), progress=False)
    whole.fit()
    monkeypatch.setattr(torch, "set_rng_state", lambda state: None)
    resumed = run_stopped_and_resumed(tmp_path, 5, dropout=0.3)
    assert not torch.equal(resumed.model.wte.weight, whole.model.wte.weight)


def test_resume_refuses_another_model(tmp_path):
    meta = {"model_config": {"n_layer": 2, "n_embd": 8, "n_head": 2}}
    Trainer(model(), data(), config(max_iters=1), out_dir=tmp_path, meta=meta, progress=False).fit()
    other = {"model_config": {"n_layer": 3, "n_embd": 8, "n_head": 4}}
    trainer = Trainer(
        model(), data(), config(max_iters=2), out_dir=tmp_path, meta=other, progress=False
    )
    with pytest.raises(
        CheckpointError,
        match=r"n_head=2 in the checkpoint, 4 now; n_layer=2 in the checkpoint, 3 now",
    ):
        trainer.fit(resume=True)
    # Without the meta, the tensors still say it.
    wider = Trainer(
        Bigram(V, n_embd=16), data(), config(max_iters=2), out_dir=tmp_path, progress=False
    )
    with pytest.raises(
        CheckpointError, match=r"wte.weight has shape \(7, 8\), the model expects \(7, 16\)"
    ):
        wider.fit(resume=True)


def test_resume_needs_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no run to resume"):
        Trainer(model(), data(), config(), out_dir=tmp_path, progress=False).fit(resume=True)


def test_ctrl_c_saves_and_stops(tmp_path):
    def interrupt(trainer):
        if trainer.iter_num == 3:
            os.kill(os.getpid(), signal.SIGINT)

    trainer = Trainer(model(), data(), config(), out_dir=tmp_path, progress=False)
    trainer.add_callback("on_step_end", interrupt)
    result = trainer.fit()
    assert result.interrupted and result.step == 3
    assert load_checkpoint(tmp_path).meta["step"] == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


class NaNAfter(Bigram):
    """A bigram model whose training loss turns NaN on its n-th training forward."""

    def __init__(self, n, split="train"):
        torch.manual_seed(0)
        super().__init__(V)
        self.n, self.split, self.calls = n, split, 0

    def forward(self, idx, targets=None):
        logits, loss = super().forward(idx, targets)
        if self.training == (self.split == "train"):
            self.calls += 1
            if self.calls >= self.n:
                loss = loss * float("nan")
        return logits, loss


def test_non_finite_loss_stops_without_overwriting_the_last_good_checkpoint(tmp_path):
    trainer = Trainer(NaNAfter(6), data(), config(), out_dir=tmp_path, progress=False)
    with pytest.raises(
        NonFiniteLossError, match=r"training loss is nan at step 6; stopped without saving"
    ):
        trainer.fit()
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.meta["step"] == 4 and len(ckpt.meta["history"]["loss"]) == 4


def test_non_finite_validation_estimate_stops_too(tmp_path):
    # Each estimate is 2 train then 2 val batches: calls 1-4 at step 0, the 7th is val at step 4.
    trainer = Trainer(NaNAfter(7, split="eval"), data(), config(), out_dir=tmp_path, progress=False)
    with pytest.raises(NonFiniteLossError, match=r"val loss estimate is nan at step 4"):
        trainer.fit()
    assert load_checkpoint(tmp_path).meta["step"] == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_dtypes_train_on_cpu(dtype):
    trainer = Trainer(model(), data(), config(dtype=dtype, max_iters=4), progress=False)
    result = trainer.fit()
    assert math.isfinite(result.val_loss) and all(math.isfinite(x) for x in trainer.losses)


def test_unknown_callback_event():
    with pytest.raises(ValueError, match="event must be one of"):
        Trainer(model(), data(), config(), progress=False).add_callback("on_batch", print)


def test_data_shorter_than_a_window_is_refused():
    splits = data()
    short = type(splits)(splits.train, splits.val[:8])
    with pytest.raises(
        ValueError, match="validation data has 8 tokens; a window of block_size=8 needs 9"
    ):
        Trainer(model(), short, config(), progress=False)


def test_a_second_ctrl_c_interrupts_at_once(tmp_path):
    def interrupt_twice(trainer):
        if trainer.iter_num == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    trainer = Trainer(model(), data(), config(), out_dir=tmp_path, progress=False)
    trainer.add_callback("on_step_end", interrupt_twice)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert load_checkpoint(tmp_path).meta["step"] == 0  # the last checkpoint stays intact


def test_an_unsupported_autocast_dtype_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="dtype=bfloat16 is not supported on device 'meta'"):
        autocast_context(torch.device("meta"), "bfloat16")

    def warns(device_type, dtype):  # how PyTorch reports some combinations: a warning
        warnings.warn("In CPU autocast, but the target dtype is not supported.", stacklevel=2)
        return contextlib.nullcontext()

    monkeypatch.setattr(torch, "autocast", warns)
    with pytest.raises(
        ValueError, match=r"float16 is not supported on device 'cpu' \(In CPU autocast"
    ):
        autocast_context(torch.device("cpu"), "float16")


def test_a_fresh_run_never_overwrites_one_in_out_dir(tmp_path):
    Trainer(model(), data(), config(max_iters=4), out_dir=tmp_path, progress=False).fit()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = Trainer(model(), data(), config(max_iters=4), out_dir=tmp_path, progress=False)
    with pytest.raises(FileExistsError, match=f"{tmp_path} already holds a training run"):
        again.fit()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


class HostReadDuringStep(AssertionError):
    pass


def test_a_training_step_never_reads_a_tensor_on_the_host(monkeypatch):
    # Every way a tensor's value reaches Python (and so makes the host wait for the device) is
    # made to fail when gptblock's own code does it inside a training step; the losses are read
    # every log_interval steps instead. (PyTorch's AdamW reads its step counter, a CPU tensor
    # even when training on a GPU: that read waits for nothing.)
    package = os.path.dirname(gptblock.__file__)
    inside = []
    original = Trainer.step

    def step(self):
        inside.append(True)
        try:
            original(self)
        finally:
            inside.pop()

    def refuse(name):
        real = getattr(torch.Tensor, name)

        def guarded(self, *args, **kwargs):
            if inside and sys._getframe(1).f_code.co_filename.startswith(package):
                raise HostReadDuringStep(f"Tensor.{name} inside a training step")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, guarded)

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy"):
        refuse(name)
    monkeypatch.setattr(Trainer, "step", step)
    trainer = Trainer(model(), data(), config(max_iters=12, log_interval=5), progress=False)
    assert trainer.fit().step == 12 and len(trainer.losses) == 12


def test_reading_the_losses_in_batches_changes_nothing():
    every = Trainer(model(), data(), config(log_interval=1), progress=False)
    every.fit()
    batched = Trainer(model(), data(), config(log_interval=7), progress=False)
    batched.fit()
    assert every.losses == batched.losses and len(every.losses) == 12


def test_a_nan_between_reads_names_its_own_step(tmp_path):
    # The NaN appears at step 6; with log_interval 5 and eval_interval 4 it is read at step 8,
    # before the checkpoint of step 8 would be written.
    trainer = Trainer(NaNAfter(6), data(), config(log_interval=5), out_dir=tmp_path, progress=False)
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 6"):
        trainer.fit()
    assert load_checkpoint(tmp_path).meta["step"] == 4


def test_auto_dtype_is_bfloat16_exactly_where_the_cpu_has_it(monkeypatch):
    from gptblock import devices

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert devices.resolve_dtype("auto", "cpu") == "bfloat16"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert devices.resolve_dtype("auto", "cpu") == "float32"
    assert devices.resolve_dtype("float16", "cpu") == "float16"
    assert devices.resolve_dtype("auto", "meta") == "float32"
