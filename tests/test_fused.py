"""FusedBlock: TransformerBlock's names and function, computed by packed QKV + SDPA."""

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

from gptblock import FusedBlock, KVCache, TransformerBlock, causal_mask


def pair(C=16, nh=2, dtype=torch.float64, **kw):
    torch.manual_seed(0)
    fused = FusedBlock(C, nh, **kw).to(dtype)
    mha = TransformerBlock(C, nh, **kw).to(dtype)
    mha.load_state_dict(fused.state_dict(), strict=True)
    return fused, mha


def test_parameter_names_and_shapes_are_transformer_blocks():
    for bias in (True, False):
        f = {k: v.shape for k, v in FusedBlock(24, 3, bias=bias).state_dict().items()}
        m = {k: v.shape for k, v in TransformerBlock(24, 3, bias=bias).state_dict().items()}
        assert f == m


@pytest.mark.parametrize("activation,bias", [("gelu", True), ("relu", False)])
def test_loads_into_the_encoder_layer_and_back(activation, bias):
    torch.manual_seed(1)
    fused = FusedBlock(16, 4, activation=activation, bias=bias).eval()
    layer = nn.TransformerEncoderLayer(
        16, 4, 64, dropout=0.0, activation=activation, batch_first=True, norm_first=True, bias=bias
    ).eval()
    layer.load_state_dict(fused.state_dict(), strict=True)
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        theirs = layer(x, src_mask=causal_mask(7), is_causal=True)
        torch.testing.assert_close(fused(x), theirs, atol=1e-5, rtol=0)
        fused2 = FusedBlock(16, 4, activation=activation, bias=bias).eval()
        fused2.load_state_dict(layer.state_dict(), strict=True)
        torch.testing.assert_close(fused2(x), theirs, atol=1e-5, rtol=0)


def test_float64_outputs_and_gradients_equal_transformer_block():
    fused, mha = pair()
    x = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    y1, y2 = fused(x), mha(x)
    torch.testing.assert_close(y1, y2, atol=1e-10, rtol=0)
    g1 = torch.autograd.grad(y1.square().sum(), [x, *fused.parameters()])
    g2 = torch.autograd.grad(y2.square().sum(), [x, *mha.parameters()])
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_masks_match_transformer_block_including_fully_blocked_rows():
    fused, mha = pair()
    x = torch.randn(3, 6, 16, dtype=torch.float64, requires_grad=True)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[0, :2] = True  # rows 0 and 1 of sequence 0 have nothing to attend to
    kpm[1, 4:] = True
    extra = torch.zeros(3, 6, 6, dtype=torch.bool)
    extra[2, 5, :3] = True
    y1 = fused(x, attn_mask=extra, key_padding_mask=kpm)
    y2 = mha(x, attn_mask=extra, key_padding_mask=kpm)
    torch.testing.assert_close(y1, y2, atol=1e-10, rtol=0)
    (gx,) = torch.autograd.grad(y1.sum(), x)
    assert torch.isfinite(gx).all()
    w1 = fused.attention_weights(x, extra, kpm)
    torch.testing.assert_close(w1, mha.attention_weights(x, extra, kpm), atol=1e-12, rtol=0)
    assert torch.equal(w1[0, :, :2], torch.zeros_like(w1[0, :, :2]))


def test_dropout_only_in_training():
    fused, _ = pair(dropout=0.5)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    fused.eval()
    assert torch.equal(fused(x), fused(x))
    fused.train()
    assert not torch.equal(fused(x), fused(x))


def test_forward_never_builds_the_attention_matrix(monkeypatch):
    # In float32 the (B, nh, T, T) weights exist only inside SDPA's kernel (bfloat16 training at
    # short contexts takes the explicit products: test_the_cpu_kernel_choice_keeps_the_function).
    fused = FusedBlock(16, 2).eval()

    def boom(*a, **k):
        raise AssertionError("softmax called: the (T, T) matrix was materialised")

    monkeypatch.setattr(F, "softmax", boom)
    fused(torch.randn(2, 5, 16))


@pytest.mark.parametrize("dtype,atol", [(torch.bfloat16, 5e-2), (torch.float16, 5e-3)])
def test_low_precision_on_cpu(dtype, atol):
    fused, _ = pair(dtype=torch.float32)
    x = torch.randn(2, 5, 16)
    ref = fused(x)
    low = fused.to(dtype)(x.to(dtype))
    assert low.dtype == dtype
    torch.testing.assert_close(low.float(), ref, atol=atol * 10, rtol=atol)


def test_non_contiguous_input_gives_the_same_result():
    fused, _ = pair()
    base = torch.randn(5, 2, 16, dtype=torch.float64)
    x = base.transpose(0, 1)  # (2, 5, 16), not contiguous
    assert not x.is_contiguous()
    torch.testing.assert_close(fused(x), fused(x.contiguous()), atol=0, rtol=0)


# --- KV cache ---------------------------------------------------------------------------------


def test_cache_prefill_then_steps_equals_full_forward():
    fused, _ = pair()
    fused.eval()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    full = fused(x)
    cache = KVCache(2, 2, max_len=10, head_size=8, dtype=torch.float64)
    parts = [fused(x[:, :4], kv_cache=cache)]  # prefill 4
    parts += [fused(x[:, t : t + 1], kv_cache=cache) for t in range(4, 7)]  # 3 single steps
    parts.append(fused(x[:, 7:], kv_cache=cache))  # a chunk of 3 after the cache has 7
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-12, rtol=0)
    assert cache.length == 10


def test_cache_overflow_and_masks_are_refused():
    fused = FusedBlock(8, 2).eval()
    cache = KVCache(1, 2, max_len=4, head_size=4)
    fused(torch.randn(1, 4, 8), kv_cache=cache)
    with pytest.raises(
        ValueError, match="KV cache holds 4 positions; 4 are filled and 1 more do not fit"
    ):
        fused(torch.randn(1, 1, 8), kv_cache=cache)
    with pytest.raises(ValueError, match="kv_cache cannot be combined"):
        fused(
            torch.randn(1, 1, 8),
            key_padding_mask=torch.zeros(1, 1, dtype=torch.bool),
            kv_cache=cache,
        )


@pytest.mark.parametrize("activation,bias", [("gelu", True), ("relu", False)])
def test_decode_step_is_forward_with_the_cache(activation, bias):
    torch.manual_seed(3)
    fused = FusedBlock(16, 4, activation=activation, bias=bias).eval()
    x = torch.randn(3, 6, 16)
    a, b = KVCache(3, 4, 8, 4), KVCache(3, 4, 8, 4)
    fused(x[:, :5], kv_cache=a)
    fused(x[:, :5], kv_cache=b)
    stepped = fused.decode_step(x[:, 5:], a)
    # The same forward (GPT.generate's one-position layout is held to it in test_generation).
    torch.testing.assert_close(stepped, fused(x[:, 5:], kv_cache=b), atol=1e-6, rtol=0)
    assert a.length == b.length == 6
    torch.testing.assert_close(stepped, fused(x)[:, 5:], atol=1e-6, rtol=0)


def test_decode_step_refuses_training_mode():
    fused = FusedBlock(8, 2).train()
    with pytest.raises(RuntimeError, match="eval mode"):
        fused.decode_step(torch.randn(1, 1, 8), KVCache(1, 2, 4, 4))


def test_an_unsupported_dtype_is_a_clear_error(monkeypatch):
    # float16 works on CPU in the torch this is tested with; older ones raise deep inside SDPA.
    def unsupported(*args, **kwargs):
        raise RuntimeError("\"scaled_dot_product_attention\" not implemented for 'Half'")

    monkeypatch.setattr(F, "scaled_dot_product_attention", unsupported)
    block = FusedBlock(8, 2).half()
    # Without gradients: training at short contexts takes the explicit products, not SDPA.
    with torch.no_grad(), pytest.raises(TypeError, match=r"does not support dtype torch.float16"):
        block(torch.randn(1, 3, 8).half())


@pytest.mark.parametrize("T", [8, 256, 257])
def test_the_cpu_kernel_choice_keeps_the_function(T, monkeypatch):
    # Training in bfloat16 at T <= 256 goes through the explicit products (1.6-8x faster there
    # than SDPA's CPU kernels); above, without gradients, or in float32, through SDPA's own
    # choice. Outputs and gradients agree.
    from gptblock.blocks import attention as attention_module

    calls = []
    products = attention_module.product_attention

    def recording(*args):
        calls.append(args[0].shape)
        return products(*args)

    monkeypatch.setattr(attention_module, "product_attention", recording)
    torch.manual_seed(0)
    block = FusedBlock(32, 2).bfloat16()
    x = torch.randn(2, T, 32, dtype=torch.bfloat16, requires_grad=True)
    y = block(x)
    y.float().square().sum().backward()
    assert len(calls) == (1 if T <= attention_module.PRODUCTS_MAX_T else 0)
    with torch.no_grad():  # nothing to train: SDPA (flash is the fastest there)
        torch.testing.assert_close(block(x).float(), y.detach().float(), atol=5e-2, rtol=2e-2)
    assert len(calls) == (1 if T <= attention_module.PRODUCTS_MAX_T else 0)
    grad, y = x.grad.clone(), y.detach()
    monkeypatch.setattr(attention_module, "PRODUCTS_MAX_T", 0)  # SDPA's own choice
    x.grad = None
    y2 = block(x)
    y2.float().square().sum().backward()
    assert len(calls) == (1 if T <= 256 else 0)
    torch.testing.assert_close(y2.detach().float(), y.float(), atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(x.grad.float(), grad.float(), atol=0.2, rtol=5e-2)
    x32 = x.detach().float()
    ref = block.float()(x32)
    torch.testing.assert_close(y.float(), ref, atol=0.1, rtol=5e-2)


@pytest.mark.parametrize("T", [1, 7, 32])
def test_product_attention_is_causal_sdpa_in_float64(T):
    # The explicit products against PyTorch's own causal SDPA: outputs and all three gradients.
    from gptblock.blocks.attention import product_attention

    torch.manual_seed(T)
    q, k, v = (torch.randn(3, 2, T, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    g = torch.randn(3, 2, T, 8, dtype=torch.float64)
    y = product_attention(q, k, v)
    grads = torch.autograd.grad(y, (q, k, v), g)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(y, ref, atol=1e-12, rtol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_product_attention_in_bfloat16_is_near_float64_and_drops_out():
    from gptblock.blocks.attention import product_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 2, 32, 16, dtype=torch.float64).unbind(0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    low = product_attention(*(t.bfloat16() for t in (q, k, v)))
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), ref, atol=3e-2, rtol=2e-2)
    assert torch.equal(product_attention(q, k, v, p=1.0), torch.zeros_like(ref))  # every weight
