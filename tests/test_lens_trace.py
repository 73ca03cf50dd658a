"""gptblock.lens.trace: activations by name and hooks, the same for every block form.

The references are independent of the traced forward pass: ``GPT.forward`` (each form's own
block modules), the blocks' own ``attention_weights``, and models whose weights were edited.
"""

import copy
import pathlib

import pytest
import torch
from torch.nn import functional as F

from gptblock import GPT, GPTConfig, load_gpt
from gptblock.blocks import attention as attention_module
from gptblock.errors import UserTypeError, UserValueError
from gptblock.lens import BLOCK_POINTS, activation_names, run_with_cache, run_with_hooks
from lens_models import FORMS, V, lens_gpt, prompt

FIXTURE_RUN = pathlib.Path(__file__).parent / "fixtures" / "run-v1"
TOL64 = dict(atol=1e-10, rtol=0)


def block_reference(model, idx, patch=None):
    """Logits through the model's own block modules, optionally replacing the stream entering
    block i by patch[i](x): the independent reference for activation patching."""
    T = idx.shape[1]
    x = model.wte(idx) + model.wpe(torch.arange(T))
    for i, block in enumerate(model.blocks):
        if patch and i in patch:
            x = patch[i](x)
        x = block(x)
    return model.lm_head(model.transformer["ln_f"](x))


# --- names and the logits ------------------------------------------------------------------


def test_the_names_are_the_interpretability_ones():
    names = activation_names(2)
    assert names[0] == "embed" and names[-1] == "ln_final" and len(names) == 2 + 7 * 2
    assert [n.split(".", 2)[2] for n in names[1:8]] == list(BLOCK_POINTS)
    assert set(BLOCK_POINTS) == {
        "resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post", "pattern", "head_out",
    }  # fmt: skip


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("names", [None, [], ["blocks.1.pattern"], ["blocks.0.head_out"]], ids=str)
def test_logits_equal_forward_for_every_form(form, names):
    model = lens_gpt(form)
    idx = prompt()
    with torch.no_grad():
        logits, cache = model.run_with_cache(idx, names)
        expected = model(idx).logits
    torch.testing.assert_close(logits, expected, **TOL64)
    assert sorted(cache) == sorted(activation_names(2) if names is None else names)


@pytest.mark.parametrize("form", FORMS)
def test_float32_logits_match_forward(form):
    model = lens_gpt(form, dtype=torch.float32)
    idx = prompt()
    with torch.no_grad():
        torch.testing.assert_close(
            model.run_with_cache(idx).logits, model(idx).logits, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("form", FORMS)
def test_every_point_has_its_shape_and_the_pattern_is_the_blocks_own(form):
    model = lens_gpt(form, n_head=4)
    idx = prompt(B=2, T=7)
    with torch.no_grad():
        _, cache = model.run_with_cache(idx)
        for i, block in enumerate(model.blocks):
            assert cache[f"blocks.{i}.pattern"].shape == (2, 4, 7, 7)
            assert cache[f"blocks.{i}.head_out"].shape == (2, 7, 4, 16)
            for point in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
                assert cache[f"blocks.{i}.{point}"].shape == (2, 7, 16)
            # The block's own attention_weights, another code path for every form.
            own = block.attention_weights(cache[f"blocks.{i}.resid_pre"])
            torch.testing.assert_close(cache[f"blocks.{i}.pattern"], own, **TOL64)
            assert cache[f"blocks.{i}.resid_pre"] is not None
        torch.testing.assert_close(cache["blocks.1.resid_pre"], cache["blocks.0.resid_post"])
        assert cache["embed"].shape == cache["ln_final"].shape == (2, 7, 16)


def test_the_fast_attention_path_is_kept_unless_patterns_or_head_outputs_are_asked(monkeypatch):
    calls = {"sdpa": 0, "softmax": 0}
    sdpa, softmax = F.scaled_dot_product_attention, attention_module.masked_softmax

    def counting_sdpa(*args, **kwargs):
        calls["sdpa"] += 1
        return sdpa(*args, **kwargs)

    def counting_softmax(*args, **kwargs):
        calls["softmax"] += 1
        return softmax(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting_sdpa)
    monkeypatch.setattr(attention_module, "masked_softmax", counting_softmax)
    model = lens_gpt(n_layer=3)
    idx = prompt()

    def count(**kwargs):
        calls.update(sdpa=0, softmax=0)
        with torch.no_grad():
            run_with_cache(model, idx, **kwargs)
        return calls["sdpa"], calls["softmax"]

    assert count(names=["blocks.2.resid_post", "blocks.0.attn_out", "embed"]) == (3, 0)
    assert count(names=[]) == (3, 0)
    assert count(names=None) == (0, 3)  # every pattern asked for: formed in every block
    assert count(names=["blocks.1.pattern"]) == (2, 1)
    assert count(names=["blocks.2.head_out"]) == (2, 1)
    assert count(names=[], hooks={"blocks.0.pattern": lambda p: p}) == (2, 1)
    assert count(names=[], hooks={"blocks.0.mlp_out": lambda m: m}) == (3, 0)
    calls.update(sdpa=0, softmax=0)
    with torch.no_grad():
        run_with_hooks(model, idx, {"blocks.1.head_out": lambda h: h})
    assert (calls["sdpa"], calls["softmax"]) == (2, 1)


# --- hooks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_patching_a_point_with_its_own_value_changes_nothing(form):
    model = lens_gpt(form)
    idx = prompt()
    with torch.no_grad():
        expected = model(idx).logits
        _, cache = model.run_with_cache(idx)
        for name in activation_names(2):
            own = cache[name].clone()
            got = model.run_with_hooks(idx, {name: lambda x, own=own: own})
            torch.testing.assert_close(got, expected, **TOL64, msg=name)
        every = {name: (lambda x: x) for name in activation_names(2)}
        torch.testing.assert_close(model.run_with_hooks(idx, every), expected, **TOL64)


@pytest.mark.parametrize("form", FORMS)
def test_every_form_honours_every_name(form):
    model = lens_gpt(form)
    idx = prompt()
    with torch.no_grad():
        clean = model(idx).logits
        for name in activation_names(2):
            seen = []

            def nudge(x, seen=seen):  # not a scaling: the LayerNorm after the stream undoes one
                seen.append(tuple(x.shape))
                noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
                return x + 0.3 * noise.to(x.dtype)

            changed = model.run_with_hooks(idx, {name: nudge})
            assert len(seen) == 1, name  # called once, at its point
            assert (changed - clean).abs().max() > 1e-3, f"the hook at {name} had no effect"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("layer,head", [(0, 1), (1, 0)])
def test_zeroing_a_head_is_removing_its_head_out(form, layer, head):
    model = lens_gpt(form)
    idx = prompt()
    at = f"blocks.{layer}."

    def zero_pattern(p):
        p = p.clone()
        p[:, head] = 0
        return p

    def zero_head_out(h):
        h = h.clone()
        h[:, :, head] = 0
        return h

    with torch.no_grad():
        _, clean = model.run_with_cache(idx)
        without = clean[at + "head_out"][:, :, head]  # (B, T, C)
        by_pattern = model.run_with_hooks(idx, {at + "pattern": zero_pattern})
        by_head_out = model.run_with_hooks(idx, {at + "head_out": zero_head_out})
        # Removing the head's write from the clean run's attn_out, downstream of the heads.
        removed = model.run_with_hooks(idx, {at + "attn_out": lambda a: a - without})
        # The independent reference: the head's columns of the output projection zeroed in a
        # copy of the model, run by the form's own forward.
        edited = copy.deepcopy(model)
        block = edited.blocks[layer]
        proj = block.sa.proj if form == "lesson" else block.self_attn.out_proj
        hs = 16 // 2
        proj.weight[:, head * hs : (head + 1) * hs] = 0
        reference = edited(idx).logits
    for got in (by_pattern, by_head_out, removed):
        torch.testing.assert_close(got, reference, **TOL64)
    assert (reference - model(idx).logits).abs().max() > 1e-3  # the head mattered


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("layer", [0, 1])
def test_activation_patching_resid_pre_from_another_prompt(form, layer):
    model = lens_gpt(form)
    clean, corrupt = prompt(seed=1), prompt(seed=2)
    name = f"blocks.{layer}.resid_pre"
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupt, [name])
        other = cache[name]

        # Every position patched: from layer i on, it is the other prompt's run.
        everywhere = model.run_with_hooks(clean, {name: lambda x: other})
        torch.testing.assert_close(everywhere, model(corrupt).logits, **TOL64)

        # One position patched, as activation patching does it.
        def at_pos(x, p=5):
            x = x.clone()
            x[:, p] = other[:, p]
            return x

        got = model.run_with_hooks(clean, {name: at_pos})
        expected = block_reference(model, clean, {layer: at_pos})
    torch.testing.assert_close(got, expected, **TOL64)
    torch.testing.assert_close(got[:, :5], model(clean).logits[:, :5], **TOL64)  # causal
    assert (got[:, 5:] - model(clean).logits[:, 5:]).abs().max() > 1e-3


def test_the_cache_holds_what_the_hooks_returned():
    model = lens_gpt()
    with torch.no_grad():
        _, cache = model.run_with_cache(
            prompt(), ["blocks.0.attn_out"], hooks={"blocks.0.attn_out": torch.zeros_like}
        )
    assert cache["blocks.0.attn_out"].abs().max() == 0


# --- no lasting change, any model ----------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_no_lasting_change_even_when_a_hook_raises(form):
    model = lens_gpt(form, dropout=0.1).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    idx = prompt()

    class Boom(Exception):
        pass

    def boom(x):
        raise Boom("from the hook")

    with pytest.raises(Boom):
        model.run_with_hooks(idx, {"blocks.1.mlp_out": boom})
    with pytest.raises(Boom):
        model.run_with_cache(idx, hooks={"blocks.0.pattern": boom})
    assert model.training  # the mode is the caller's
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.run_with_cache(idx).logits, model(idx).logits, **TOL64)


def test_a_model_in_training_mode_is_traced_as_the_eval_function():
    model = lens_gpt(dropout=0.5).train()
    idx = prompt()
    with torch.no_grad():
        traced = model.run_with_cache(idx).logits
        assert model.training
        torch.testing.assert_close(traced, model.eval()(idx).logits, **TOL64)


def test_a_model_loaded_from_a_checkpoint():
    model, tok, _ = load_gpt(FIXTURE_RUN)
    idx = torch.tensor([tok.encode("The block ")])
    with torch.no_grad():
        logits, cache = model.run_with_cache(idx)
        torch.testing.assert_close(logits, model(idx).logits, atol=1e-5, rtol=0)
    assert cache["blocks.0.pattern"].shape == (1, 2, 10, 10)


def test_gradients_reach_the_parameters_of_every_form():
    for form in FORMS:
        model = lens_gpt(form)
        logits, cache = model.run_with_cache(prompt(), ["blocks.1.head_out"])
        (logits.sum() + cache["blocks.1.head_out"].sum()).backward()
        first = model.blocks[0]
        q = first.sa.heads[0].query.weight if form == "lesson" else first.self_attn.in_proj_weight
        assert q.grad is not None and q.grad.abs().max() > 0, form


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("form", FORMS)
def test_on_the_gpu_as_on_the_cpu(form):
    model = lens_gpt(form)
    idx = prompt()
    with torch.no_grad():
        cpu = model.run_with_cache(idx)
        gpu = copy.deepcopy(model).cuda().run_with_cache(idx.cuda())
        torch.testing.assert_close(gpu.logits.cpu(), cpu.logits, atol=1e-8, rtol=0)
        for name in cpu.cache:
            torch.testing.assert_close(gpu.cache[name].cpu(), cpu.cache[name], atol=1e-8, rtol=0)
        patched = (
            copy.deepcopy(model)
            .cuda()
            .run_with_hooks(idx.cuda(), {"blocks.0.head_out": torch.zeros_like})
        )
        assert patched.device.type == "cuda"


# --- misuse --------------------------------------------------------------------------------


def test_an_unknown_name_lists_the_valid_ones():
    model = lens_gpt()
    for call in (
        lambda: model.run_with_cache(prompt(), ["blocks.2.resid_pre"]),
        lambda: model.run_with_cache(prompt(), ["resid_pre"]),
        lambda: model.run_with_hooks(prompt(), {"blocks.0.hook_resid_pre": lambda x: x}),
    ):
        with pytest.raises(UserValueError) as e:
            call()
        message = str(e.value)
        assert "unknown activation name" in message and "i in 0..1" in message
        assert all(name in message for name in ("embed", "ln_final", *BLOCK_POINTS))


def test_a_name_not_cached_says_how_to_ask_for_it():
    model = lens_gpt()
    with torch.no_grad():
        _, cache = model.run_with_cache(prompt(), ["embed"])
    with pytest.raises(KeyError, match="was not cached: pass it in names"):
        cache["blocks.0.pattern"]
    with pytest.raises(KeyError, match="unknown activation name"):
        cache["blocks.7.pattern"]
    assert "blocks.0.pattern" not in cache and "embed" in cache and len(cache) == 1
    assert "embed: (2, 9, 16)" in repr(cache)


@pytest.mark.parametrize(
    "hook,exc,match",
    [
        (lambda x: None, UserTypeError, "returned NoneType; a hook returns the activation"),
        (lambda x: x[:, :-1], UserValueError, r"shape \(2, 8, 16\).*expected.*\(2, 9, 16\)"),
        (lambda x: x.float(), UserValueError, "returned a torch.float32 tensor"),
    ],
)
def test_a_hook_returning_the_wrong_thing_is_named(hook, exc, match):
    with pytest.raises(exc, match=match):
        lens_gpt().run_with_hooks(prompt(), {"blocks.0.resid_mid": hook})


def test_bad_arguments_are_user_errors():
    model = lens_gpt()
    with pytest.raises(UserTypeError, match="names must be a list of names, got the string"):
        model.run_with_cache(prompt(), "embed")
    with pytest.raises(UserTypeError, match=r"names must be strings, got \['embed'\] \(list\)"):
        model.run_with_cache(prompt(), [["embed"]])
    with pytest.raises(UserTypeError, match="not a function"):
        model.run_with_hooks(prompt(), {"embed": 3})
    with pytest.raises(UserTypeError, match="hooks must be a dict"):
        model.run_with_hooks(prompt(), [("embed", lambda x: x)])
    with pytest.raises(UserValueError, match="T=13 exceeds block_size=12"):
        model.run_with_cache(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(UserValueError, match=f"token id {V}, outside the vocabulary"):
        model.run_with_cache(torch.full((1, 3), V))
    with pytest.raises(UserTypeError, match=r"tensor of token ids of dtype torch\.int64"):
        model.run_with_cache(torch.zeros(1, 3))
    with pytest.raises(UserTypeError, match="model must be a GPT, got Linear"):
        run_with_cache(torch.nn.Linear(2, 2), prompt())
    assert isinstance(GPT(GPTConfig(V, 4, 1, 1, 4)).run_with_hooks(prompt(T=4), {}), torch.Tensor)
    model.transformer["h"][1] = torch.nn.Identity()  # not a block: said, not misread
    with pytest.raises(UserTypeError, match=r"expected a block: .* got Identity"):
        model.run_with_cache(prompt())
