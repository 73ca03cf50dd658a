"""The modern block's parts as options of the block and the GPT (issue 20, item 1).

Every combination: the cached decoder equals a full recomputation, training runs, the lens's
pass equals ``forward``, ``convert`` carries it to the fused form and refuses the others; the
default options are GPT-2's block, parameter for parameter.
"""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptblock import (
    GPT,
    BlockConfig,
    ConversionError,
    FusedBlock,
    GPTConfig,
    RunMeta,
    convert,
)
from gptblock.blocks.attention import PACKED
from gptblock.blocks.config import applicable
from gptblock.blocks.fused import block_forward
from gptblock.data.batches import CharTokenizer
from gptblock.interop.hf import to_hf
from gptblock.lens.readout import direct_logit_attribution
from gptblock.model.footprint import parameter_count
from gptblock.model.generation.decode import Decoder

OPTIONS = st.fixed_dictionaries(
    {
        "norm": st.sampled_from(["layernorm", "rmsnorm"]),
        "mlp": st.sampled_from(["dense", "swiglu"]),
        "activation": st.sampled_from(["gelu", "relu2"]),
        "d_ff": st.sampled_from([None, 24]),
        "n_kv_head": st.sampled_from([None, 2, 1]),
        "qk_norm": st.booleans(),
        "parallel_residual": st.booleans(),
        "position": st.sampled_from(["learned", "rope", "none"]),
        "rotary_dim": st.sampled_from([None, 2]),
        "rope_pairing": st.sampled_from(["halves", "adjacent"]),
        "bias": st.booleans(),
        "tie_embeddings": st.booleans(),
    }
)


def gpt(seed=0, **options):
    torch.manual_seed(seed)
    options = applicable(GPTConfig, options)  # a sampled value that could not act: dropped
    config = GPTConfig(vocab_size=13, block_size=10, n_layer=2, n_head=4, n_embd=16, **options)
    return GPT(config).double().eval()


@settings(max_examples=25, deadline=None)
@given(options=OPTIONS)
def test_cache_equals_recompute_for_every_combination(options):
    model = gpt(**options)
    idx = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(1))
    full = model(idx).logits  # (B, T, V)
    with torch.no_grad():
        decoder = Decoder(model)
        steps = [decoder.prefill(idx[:, :4])]
        steps += [decoder.step(idx[:, t : t + 1]) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)
    a = model.generate(idx[:, :3], 9, temperature=0)  # slides past block_size
    b = model.generate(idx[:, :3], 9, temperature=0, use_cache=False)
    assert torch.equal(a, b)


@settings(max_examples=10, deadline=None)
@given(options=OPTIONS)
def test_every_combination_trains_and_counts_its_parameters(options):
    model = gpt(**options).float().train()
    assert parameter_count(model.config) == model.num_params(exclude_position_embeddings=False)
    idx = torch.randint(0, 13, (2, 8))
    loss = model(idx, targets=idx).loss
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@settings(max_examples=10, deadline=None)
@given(options=OPTIONS)
def test_the_lens_runs_the_same_model(options):
    model = gpt(**options)
    idx = torch.randint(0, 13, (1, 6))
    run = model.run_with_cache(idx)
    torch.testing.assert_close(run.logits, model(idx).logits, rtol=0, atol=1e-12)
    # the direct logit attribution's identity (it raises when the parts do not add up)
    direct_logit_attribution(model, run, token=3, position=-1)
    torch.testing.assert_close(model.run_with_hooks(idx, {}), run.logits, rtol=0, atol=1e-12)


def test_defaults_are_gpt2s_block():
    config = BlockConfig(16, 2)
    assert config.modern == () and config.d_ff == 64 and config.n_kv_head == 2
    assert sorted(FusedBlock(16, 2).state_dict()) == sorted(
        [
            "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
            "self_attn.in_proj_weight", "self_attn.in_proj_bias",
            "self_attn.out_proj.weight", "self_attn.out_proj.bias",
            "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
        ]
    )  # fmt: skip
    assert FusedBlock(16, 2).self_attn.heads is PACKED  # the path GPT-2's block always ran


def test_a_modern_block_names_its_parts():
    block = FusedBlock(
        16, 4, bias=False, norm="rmsnorm", mlp="swiglu", d_ff=40, n_kv_heads=2,
        qk_norm=True, parallel_residual=True, rope=True,
    )  # fmt: skip
    shapes = {k: tuple(v.shape) for k, v in block.state_dict().items()}
    assert shapes == {
        "norm1.weight": (16,),
        "self_attn.in_proj_weight": (16 + 2 * 2 * 4, 16),  # q, then 2 key and 2 value heads
        "self_attn.out_proj.weight": (16, 16),
        "self_attn.q_norm.weight": (4,),
        "self_attn.k_norm.weight": (4,),
        "linear1.weight": (40, 16),
        "linear2.weight": (16, 40),
        "linear3.weight": (40, 16),
    }


@pytest.mark.parametrize(
    "options, message",
    [
        ({"norm": "batchnorm"}, r"norm must be one of \('layernorm', 'rmsnorm'\), got 'batchnorm'"),
        ({"mlp": "geglu"}, r"mlp must be one of \('dense', 'swiglu'\), got 'geglu'"),
        ({"n_kv_head": 3}, r"n_kv_head=3 does not divide n_head=4"),
        ({"n_kv_head": 0}, r"n_kv_head must be a positive int, got 0"),
        ({"d_ff": 0}, r"d_ff must be a positive int, got 0"),
        ({"position": "rope", "rotary_dim": 3}, r"rotary_dim must be an even int in \[0, 4\]"),
        (
            {"position": "rope", "rope_pairing": "gptj"},
            r"rope_pairing must be one of \('halves', 'adjacent'\)",
        ),
        ({"position": "rope", "rope_theta": 0.0}, r"rope_theta must be a positive float, got 0.0"),
        ({"qk_norm": 1}, r"qk_norm must be a bool, got 1"),
        (
            {"position": "alibi"},
            r"position must be one of \('learned', 'rope', 'none'\), got 'alibi'",
        ),
    ],
)
def test_bad_options_name_the_value(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        BlockConfig(16, 4, **options)


def test_other_forms_refuse_the_modern_options_by_name():
    with pytest.raises(ValueError, match=r"block='mha' cannot express norm='rmsnorm'"):
        GPTConfig(13, 8, 1, 2, 16, block="mha", norm="rmsnorm")
    with pytest.raises(ValueError, match=r"block='lesson' cannot express n_kv_head=1"):
        GPTConfig(13, 8, 1, 2, 16, block="lesson", activation="relu", n_kv_head=1)
    with pytest.raises(ValueError, match=r"position must be one of"):
        GPTConfig(13, 8, 1, 2, 16, position="sinusoidal")
    block = FusedBlock(16, 4, mlp="swiglu")
    for to in ("mha", "encoder_layer"):
        with pytest.raises(ConversionError, match=r"cannot express mlp='swiglu'"):
            convert(block, to)


def test_convert_carries_the_modern_block_to_the_fused_form():
    torch.manual_seed(0)
    block = FusedBlock(16, 4, norm="rmsnorm", n_kv_heads=1, rope=True, rotary_dim=2).eval()
    twin = convert(block, "fused")
    x = torch.randn(2, 5, 16)
    assert twin.config == block.config and torch.equal(twin(x), block(x))


def test_block_forward_on_the_parts_is_the_module():
    torch.manual_seed(0)
    block = FusedBlock(16, 4, mlp="swiglu", parallel_residual=True, rope=True).eval()
    x = torch.randn(2, 5, 16)
    assert torch.equal(block_forward(block.parts(), x), block(x))


def test_attention_weights_follow_the_modern_attention():
    torch.manual_seed(0)
    model = gpt(n_kv_head=2, position="rope", qk_norm=True).float()
    block = model.blocks[0]
    x = torch.randn(1, 6, 16)
    run = model.run_with_cache(torch.randint(0, 13, (1, 6)))
    h = run.cache["blocks.0.resid_pre"]
    torch.testing.assert_close(block.attention_weights(h), run.cache["blocks.0.pattern"])
    assert block.attention_weights(x).shape == (1, 4, 6, 6)


def test_the_config_round_trips_through_a_checkpoints_json():
    config = GPTConfig(13, 8, 1, 4, 16, norm="rmsnorm", mlp="swiglu", d_ff=40, n_kv_head=2,
                       position="rope", rope_pairing="adjacent", qk_norm=True)  # fmt: skip
    assert GPTConfig(**dataclasses.asdict(config)) == config
    tok = CharTokenizer(list("abcdefghijklm"))
    meta = RunMeta(config, tok)
    assert RunMeta.from_json(meta.to_json(), "test").model_config == config


def test_a_config_written_before_the_options_is_gpt2s():
    old = {"vocab_size": 13, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 16}
    config = GPTConfig(**old)
    assert config.block_config().modern == () and config.position == "learned"


MODERN_RUN = dict(
    n_layer=1, n_head=4, n_embd=16, block_size=16, batch_size=4, max_iters=4,
    eval_interval=2, eval_iters=1, warmup=1, progress=False, device="cpu",
    norm="rmsnorm", mlp="swiglu", d_ff=40, n_kv_head=2, qk_norm=True, position="rope",
    rope_pairing="adjacent", rotary_dim=2, parallel_residual=True,
)  # fmt: skip


def test_a_modern_gpt_trains_saves_loads_and_resumes(tmp_path):
    from gptblock import load_gpt, train_gpt
    from gptblock.data.text import default_corpus
    from gptblock.runs.checkpoint import load_checkpoint
    from gptblock.train.run import prepare_run

    text = default_corpus()[:3000]
    run = train_gpt(text=text, out_dir=tmp_path, seed=3, **MODERN_RUN)
    model, tok, ckpt = load_gpt(tmp_path, kind="last")
    assert model.config == run.meta.model_config and model.config.n_kv_head == 2
    assert "transformer.wpe.weight" not in model.state_dict()
    idx = torch.tensor([tok.encode("The ")])
    trained = run.model.eval()
    torch.testing.assert_close(model(idx).logits, trained(idx).logits, rtol=0, atol=0)
    with prepare_run(text=text, out_dir=tmp_path, seed=3, resume=True,
                     **{**MODERN_RUN, "max_iters": 6}) as again:  # fmt: skip
        again.fit()
    assert load_checkpoint(tmp_path).meta["step"] == 6
    with pytest.raises(ValueError, match="n_kv_head=2 in the checkpoint, 4 now"):
        train_gpt(
            text=text,
            out_dir=tmp_path,
            resume=True,
            **{**MODERN_RUN, "n_kv_head": 4, "max_iters": 8},
        )


@pytest.mark.parametrize(
    "options, name",
    [
        ({"norm": "rmsnorm"}, "norm='rmsnorm'"),
        ({"position": "rope"}, "position='rope'"),
        ({"n_kv_head": 1}, "n_kv_head=1"),
        ({"activation": "relu2"}, "activation='relu2'"),
    ],
)
def test_gpt2s_format_refuses_the_modern_options_by_name(options, name):
    model = GPT(GPTConfig(13, 8, 1, 2, 16, **options))
    with pytest.raises(ValueError, match=f"GPT-2's format cannot express {name}"):
        to_hf(model)


def test_transformer_block_refuses_the_modern_options_by_name():
    from gptblock import TransformerBlock

    with pytest.raises(ValueError, match=r"TransformerBlock .* cannot express n_kv_head=1"):
        TransformerBlock(16, 2, n_kv_heads=1)
    assert TransformerBlock(16, 2, n_kv_heads=2).config.modern == ()  # GPT-2's value: fine


def test_the_modern_block_page_runs():
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "modern-block.md"
    examples = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(examples) >= 5
    for code in examples:
        exec(compile(code, str(page), "exec"), {"__name__": "page"})
