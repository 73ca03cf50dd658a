"""Muon (with AdamW for the rest): the orthogonalisation, the update rule, the groups, resume."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from gptblock import GPT, CharTokenizer, GPTConfig, Trainer
from gptblock.data.batches import split_tokens
from gptblock.data.text import shakespeare
from gptblock.train.config import TrainConfig, configure_optimizer, lr_at
from gptblock.train.muon import MuonAdamW, orthogonalise
from standin import pattern_tokens


def newton_schulz_numpy(g, steps=5):
    """The same iteration written independently, in float64 NumPy, for one matrix."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (np.linalg.norm(g) + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(8, 8), (24, 8), (8, 24), (3, 16, 16)])
def test_orthogonalise_matches_an_independent_iteration_and_flattens_the_spectrum(shape):
    g = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ours = orthogonalise(g)
    mats = ours.reshape(-1, *shape[-2:])
    for mine, gi in zip(mats, g.reshape(-1, *shape[-2:]), strict=True):
        np.testing.assert_allclose(mine.numpy(), newton_schulz_numpy(gi.numpy()), atol=1e-10)
        s = torch.linalg.svdvals(mine)
        assert s.min() > 0.6 and s.max() < 1.3, s  # every direction moves about as much
    # The polar factor's direction: the update correlates strongly with U V^T.
    u, _, vh = torch.linalg.svd(g.reshape(-1, *shape[-2:])[0], full_matrices=False)
    cos = (mats[0] * (u @ vh)).sum() / (mats[0].norm() * (u @ vh).norm())
    assert cos > 0.95


def test_one_muon_step_is_momentum_orthogonalised():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(12, 4))
    opt = MuonAdamW([{"params": [w], "algorithm": "muon", "lr": 0.1, "momentum": 0.9}])
    before = w.detach().clone()
    grads = [torch.randn(12, 4) for _ in range(2)]
    buf = torch.zeros(12, 4)
    for g in grads:
        w.grad = g.clone()
        opt.step()
        buf = 0.9 * buf + g
        nesterov = g + 0.9 * buf
        before -= 0.1 * math.sqrt(12 / 4) * orthogonalise(nesterov[None]).squeeze(0)
    torch.testing.assert_close(w.detach(), before, atol=1e-6, rtol=0)


def test_the_adamw_groups_are_torchs_adamw():
    torch.manual_seed(0)
    a, b = nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(5, 3))
    b.data.copy_(a.data)
    ours = MuonAdamW([{"params": [a], "algorithm": "adamw", "lr": 0.01, "weight_decay": 0.1}])
    ref = torch.optim.AdamW([b], lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    for _ in range(5):
        g = torch.randn(5, 3)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a.detach(), b.detach(), atol=1e-6, rtol=0)


def test_gpt_groups_muon_takes_the_block_matrices_only():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    opt = configure_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02))
    names = {id(p): n for n, p in model.named_parameters()}
    by = {}
    for g in opt.param_groups:
        by.setdefault((g["algorithm"], g.get("split", 1)), []).extend(
            names[id(p)] for p in g["params"]
        )
    assert sorted(by[("muon", 3)]) == [
        f"transformer.h.{i}.self_attn.in_proj_weight" for i in range(2)
    ]
    assert {n.rsplit(".", 2)[-2] for n in by[("muon", 1)]} == {"out_proj", "linear1", "linear2"}
    adam = by[("adamw", 1)]
    assert "transformer.wte.weight" in adam and "transformer.wpe.weight" in adam
    adam_groups = [g for g in opt.param_groups if g["algorithm"] == "adamw"]
    assert all(p.dim() < 2 for g in adam_groups if g["weight_decay"] == 0 for p in g["params"])
    muon_groups = [g for g in opt.param_groups if g["algorithm"] == "muon"]
    assert all(g["lr_scale"] == pytest.approx(20.0) for g in muon_groups)


def test_the_schedule_scales_every_group():
    # After each step every group's lr is the schedule's, times its own peak over lr's.
    data = split_tokens(pattern_tokens(400, 7), block_size=8)
    cfg = TrainConfig(block_size=8, batch_size=4, optimizer="muon", lr=1e-3, muon_lr=0.02,
                      warmup=2, max_iters=10, eval_interval=10, eval_iters=1)  # fmt: skip
    torch.manual_seed(0)
    trainer = Trainer(GPT(GPTConfig(7, 8, 1, 2, 8)), data, cfg, progress=False)
    seen = []
    trainer.add_callback(
        "on_step_end",
        lambda t: seen.append({g["algorithm"]: g["lr"] for g in t.optimizer.param_groups}),
    )
    trainer.fit()
    for step, lrs in enumerate(seen):
        assert lrs["adamw"] == pytest.approx(lr_at(step, cfg))
        assert lrs["muon"] == pytest.approx(lr_at(step, cfg) * 20)


def test_muon_training_resumes_bit_exactly(tmp_path):
    data = split_tokens(pattern_tokens(800, 7), block_size=8)
    cfg = TrainConfig(block_size=8, batch_size=4, max_iters=10, eval_interval=5, eval_iters=1,
                      optimizer="muon", schedule="wsd", warmup=2, lr=3e-3, seed=0)  # fmt: skip

    def model():
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, n_embd=8))

    whole = Trainer(model(), data, cfg, progress=False)
    whole.fit()
    first = Trainer(model(), data, cfg, out_dir=tmp_path, progress=False)
    first.add_callback("on_step_end", lambda t: t.request_stop() if t.iter_num == 4 else None)
    first.fit()
    second = Trainer(model(), data, cfg, out_dir=tmp_path, progress=False)
    second.fit(resume=True)
    for name, p in whole.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], p), name
    assert second.losses == whole.losses


def test_muon_learns_faster_than_adamw_at_the_same_steps():
    text = shakespeare()[:60_000]
    tok = CharTokenizer.from_text(text)
    data = split_tokens(tok.encode(text), block_size=32)

    def final_loss(**kw):
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=32)
        cfg = TrainConfig(block_size=32, batch_size=16, max_iters=80, eval_interval=80,
                          eval_iters=4, warmup=5, seed=0, **kw)  # fmt: skip
        return Trainer(GPT(config), data, cfg, progress=False).fit().val_loss

    muon, adamw = final_loss(optimizer="muon", lr=3e-3, muon_lr=0.03), final_loss(lr=3e-3)
    assert muon < adamw - 0.1, (muon, adamw)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="optimizer must be one of \\('adamw', 'muon'\\)"):
        TrainConfig(optimizer="sgd")
    with pytest.raises(ValueError, match="schedule must be one of"):
        TrainConfig(schedule="step")
    with pytest.raises(ValueError, match="muon_momentum must be in"):
        TrainConfig(muon_momentum=1.0)
    with pytest.raises(ValueError, match="Muon needs 2-D weights"):
        MuonAdamW([{"params": [nn.Parameter(torch.zeros(3))], "algorithm": "muon", "lr": 0.1}])


def test_a_run_without_out_dir_never_imports_torch_dynamo():
    # torch.optim.Optimizer's add_param_group, zero_grad and state_dict import torch._dynamo
    # (as long as `import torch`) at their first call; Muon's own add_param_group and zero_grad
    # do not, and a run with nowhere to save captures no state_dict: a speedrun's start.
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from gptblock.train.run import prepare_run\n"
        "run = prepare_run('shakespeare', out_dir=None, progress=False, device='cpu', n_layer=1,"
        " n_embd=16, n_head=2, batch_size=4, max_iters=2, eval_iters=1)\n"
        "assert run.trainer.optimizer.__class__.__name__ == 'MuonAdamW'\n"
        "run.trainer.add_callback('on_step_end', lambda t: t.request_stop())\n"
        "run.fit()  # one step, and the saves a stopped run makes\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "False"
