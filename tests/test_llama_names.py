"""The modern parts load state_dicts in both Llama conventions (issue 20, item 2): Hugging Face's
(``gate_proj``/``up_proj``/``down_proj``, ``q_proj``..., ``input_layernorm``,
``post_attention_layernorm``) and Meta's (``w1``/``w3``/``w2``, ``wq``..., ``attention_norm``,
``ffn_norm``), each equal to the function forms; ``LlamaBlock`` equals ``FusedBlock``'s modern
options and the NumPy oracle."""

import itertools

import pytest
import torch

from gptblock import (
    FusedBlock,
    GroupedQueryAttention,
    LlamaBlock,
    SwiGLU,
    apply_rotary,
    attention,
    convert,
    rmsnorm,
    swiglu,
)
from gptblock.reference.modern import ModernOptions, modern_forward

C, NH, NKV, F_ = 16, 4, 2, 24
HS = C // NH


SEEDS = itertools.count(1)


def _randn(*shape):
    g = torch.Generator().manual_seed(next(SEEDS))
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def test_swiglu_loads_hugging_faces_names_and_metas_and_is_the_function():
    w1, w2, w3 = _randn(F_, C), _randn(C, F_), _randn(F_, C)
    x = _randn(2, 5, C)
    expected = swiglu(x, w1, w2, w3)
    for state in (
        {"gate_proj.weight": w1, "down_proj.weight": w2, "up_proj.weight": w3},
        {"w1.weight": w1, "w2.weight": w2, "w3.weight": w3},
    ):
        mlp = SwiGLU(C, F_).double()
        assert str(mlp.load_state_dict(state)) == "<All keys matched successfully>"
        torch.testing.assert_close(mlp(x), expected, rtol=0, atol=1e-12)
        assert sorted(mlp.state_dict()) == [
            "down_proj.weight",
            "gate_proj.weight",
            "up_proj.weight",
        ]
    with pytest.raises(RuntimeError, match=r"w4\.weight"):  # strict loading still names strays
        SwiGLU(C, F_).double().load_state_dict({"w1.weight": w1, "w2.weight": w2, "w4.weight": w3})


def test_grouped_query_attention_loads_both_names_and_is_the_function():
    wq, wk, wv, wo = _randn(C, C), _randn(NKV * HS, C), _randn(NKV * HS, C), _randn(C, C)
    x = _randn(2, 5, C)
    pos = torch.arange(5)
    q = apply_rotary((x @ wq.T).view(2, 5, NH, HS).transpose(1, 2), pos)  # (B, nh, T, hs)
    k = apply_rotary((x @ wk.T).view(2, 5, NKV, HS).transpose(1, 2), pos)  # (B, nkv, T, hs)
    v = (x @ wv.T).view(2, 5, NKV, HS).transpose(1, 2)  # (B, nkv, T, hs)
    expected = attention(q, k, v).transpose(1, 2).reshape(2, 5, C) @ wo.T  # (B, T, C)
    for names in (("q_proj", "k_proj", "v_proj", "o_proj"), ("wq", "wk", "wv", "wo")):
        attn = GroupedQueryAttention(C, NH, NKV).double()
        attn.load_state_dict(
            {f"{n}.weight": w for n, w in zip(names, (wq, wk, wv, wo), strict=True)}
        )
        torch.testing.assert_close(attn(x), expected, rtol=0, atol=1e-12)


def _fused():
    torch.manual_seed(0)
    block = FusedBlock(C, NH, bias=False, norm="rmsnorm", mlp="swiglu", d_ff=F_, n_kv_heads=NKV,
                       rope=True, norm_eps=1e-6).double()  # fmt: skip
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.5)
    return block


def _llama_state(block, meta=False):
    """``FusedBlock``'s weights under Hugging Face's layer names (or Meta's)."""
    w = block.state_dict()
    q, k, v = torch.split(w["self_attn.in_proj_weight"], [C, NKV * HS, NKV * HS])
    hf = {
        "input_layernorm.weight": w["norm1.weight"],
        "self_attn.q_proj.weight": q,
        "self_attn.k_proj.weight": k,
        "self_attn.v_proj.weight": v,
        "self_attn.o_proj.weight": w["self_attn.out_proj.weight"],
        "post_attention_layernorm.weight": w["norm2.weight"],
        "mlp.gate_proj.weight": w["linear1.weight"],
        "mlp.up_proj.weight": w["linear3.weight"],
        "mlp.down_proj.weight": w["linear2.weight"],
    }
    if not meta:
        return hf
    rename = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
              "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
              "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
              "mlp.down_proj": "feed_forward.w2"}  # fmt: skip
    return {rename[key.rpartition(".")[0]] + ".weight": value for key, value in hf.items()}


@pytest.mark.parametrize("meta", [False, True], ids=["hugging-face", "meta"])
def test_the_llama_block_loads_either_layer_naming_and_is_the_fused_block_and_the_oracle(meta):
    fused = _fused()
    block = LlamaBlock(C, NH, F_, n_kv_heads=NKV).double()
    assert (
        str(block.load_state_dict(_llama_state(fused, meta))) == "<All keys matched successfully>"
    )
    assert set(block.state_dict()) == set(_llama_state(fused))  # it writes Hugging Face's names
    x = _randn(2, 6, C)
    with torch.no_grad():
        torch.testing.assert_close(block(x), fused(x), rtol=0, atol=1e-12)
        o = ModernOptions(
            n_head=NH, n_kv_head=NKV, norm="rmsnorm", mlp="swiglu", position="rope", norm_eps=1e-6
        )
        params = {key: value.numpy() for key, value in fused.state_dict().items()}
        oracle = torch.from_numpy(modern_forward(params, x.numpy(), o)[0])
        torch.testing.assert_close(block(x), oracle, rtol=0, atol=1e-10)
        offset = torch.arange(4, 10)
        torch.testing.assert_close(block(x, offset), fused(x, positions=offset), rtol=0, atol=1e-12)
    h = block.input_layernorm(x)
    torch.testing.assert_close(h, rmsnorm(x, fused.norm1.weight, 1e-6), rtol=0, atol=1e-12)


def test_the_llama_block_has_hugging_faces_layer_names():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=C, num_attention_heads=NH, num_key_value_heads=NKV,
                                      intermediate_size=F_, num_hidden_layers=1, vocab_size=8)  # fmt: skip
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(config, layer_idx=0)
    block = LlamaBlock(C, NH, F_, n_kv_heads=NKV)
    assert str(block.load_state_dict(layer.state_dict())) == "<All keys matched successfully>"
    assert set(block.state_dict()) == set(layer.state_dict())


def test_the_llama_block_refuses_bad_input_in_one_line():
    block = LlamaBlock(C, NH, F_)
    with pytest.raises(ValueError, match=r"expected input of shape \(B, T, 16\)"):
        block(torch.zeros(2, 3, 8))
    with pytest.raises(ValueError, match=r"positions must have shape \(3,\) or \(2, 3\)"):
        block(torch.zeros(2, 3, C), torch.arange(4))


def test_the_llama_block_converts_and_runs_as_the_fused_block_it_is():
    block = LlamaBlock(C, NH, F_, n_kv_heads=NKV).double().eval()
    fused = convert(block, "fused")
    assert type(fused) is FusedBlock and "self_attn.in_proj_weight" in fused.state_dict()
    x = _randn(2, 5, C)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), block(x), rtol=0, atol=0)
