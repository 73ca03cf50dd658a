"""Misuse, class 4: the Python API refuses what it cannot do (issue 12).

Each case calls the API with one bad argument and asserts a ``UserError`` that is the built-in
``TypeError`` or ``ValueError`` it refines, with a message naming the value; ``pytest.raises``
with the user error class fails the test on any other exception (a ``RuntimeError`` from deep
inside PyTorch, an ``IndexError``), and on a call that returns instead (a silent wrong answer).
The cases that are not mistakes (an int32 id, bf16 input under autocast, a NumPy float eps, a
temperature that underflows) are checked to work as documented, against a reference.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from gptblock import (
    GPT,
    CharTokenizer,
    FusedBlock,
    GPTConfig,
    KVCache,
    TrainConfig,
    Trainer,
    TransformerBlock,
    UserError,
    lesson,
    reference,
)
from gptblock.data.batches import TokenSplits
from gptblock.data.text import read_text
from gptblock.devices import set_threads
from gptblock.loading import load_gpt
from gptblock.runs.checkpoint import save_checkpoint
from gptblock.sampling import sample_text
from gptblock.train.evaluate import loss_of
from gptblock.train.run import prepare_run

FIXTURE = Path(__file__).parent / "fixtures" / "run-v1"

BLOCKS = {
    "fused": lambda: FusedBlock(16, 2),
    "mha": lambda: TransformerBlock(16, 2),
    "lesson": lambda: lesson.Block(16, 2, 8, 0.0),
}


def refuses(kind, match, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises a UserError that is also ``kind``, matching ``match``."""
    with pytest.raises(UserError, match=match) as e:
        fn(*args, **kwargs)
    assert isinstance(e.value, kind), type(e.value).__mro__


# --- the blocks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", BLOCKS)
@pytest.mark.parametrize(
    "dtype, kind, match",
    [
        (
            torch.float64,
            TypeError,
            "input has dtype torch.float64 but the block's parameters are torch.float32",
        ),
        (torch.float16, TypeError, "input has dtype torch.float16"),
        (torch.bfloat16, TypeError, "input has dtype torch.bfloat16"),
        (torch.long, TypeError, "expected a floating-point input"),
        (torch.bool, TypeError, "expected a floating-point input"),
    ],
)
def test_a_block_refuses_an_input_of_another_dtype(form, dtype, kind, match):
    refuses(kind, match, BLOCKS[form](), torch.zeros(2, 3, 16).to(dtype))


@pytest.mark.parametrize("form", BLOCKS)
def test_a_block_refuses_an_input_on_another_device(form):
    refuses(
        ValueError,
        "the input is on meta but the block's parameters are on cpu",
        BLOCKS[form](),
        torch.zeros(2, 3, 16, device="meta"),
    )


@pytest.mark.parametrize("form", BLOCKS)
def test_a_float64_block_takes_float64_and_autocast_may_mix(form):
    block = BLOCKS[form]().eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        ref = block(x)
        assert torch.allclose(block.double()(x.double()).float(), ref, atol=1e-5)
        block.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # casts per operation: allowed
            mixed = block(x.bfloat16())
    assert torch.allclose(mixed.float(), ref, atol=0.1)


# --- the GPT --------------------------------------------------------------------------------


def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.bool, torch.float32])
def test_token_ids_of_a_dtype_the_embedding_cannot_index_are_refused(dtype):
    refuses(
        TypeError,
        f"idx must be .* dtype torch.int64 or torch.int32, got {dtype}",
        gpt(),
        torch.zeros(2, 3, dtype=dtype),
    )
    refuses(TypeError, "idx must be", gpt().generate, torch.zeros(1, 1, dtype=dtype), 2)


def test_int32_ids_work_and_give_the_int64_logits():
    m, idx = gpt(), torch.randint(0, 11, (2, 5))
    assert torch.equal(m(idx.int()).logits, m(idx).logits)
    assert m.generate(idx.int()[:, :1], 3, temperature=0).dtype == torch.int64


def test_targets_the_loss_cannot_read_are_refused():
    m, idx = gpt(), torch.zeros(2, 3, dtype=torch.long)
    refuses(TypeError, "targets must be .* torch.int64, got torch.int32", m, idx, idx.int())
    refuses(ValueError, "every entry of targets is -1", m, idx, torch.full((2, 3), -1))
    loss = m(idx, torch.tensor([[-1, -1, -1], [-1, 3, -1]])).loss  # one target: finite
    assert torch.isfinite(loss)


def test_ids_on_another_device_are_refused():
    refuses(
        ValueError,
        "idx is on meta but the model is on cpu",
        gpt(),
        torch.zeros(1, 2, dtype=torch.long, device="meta"),
    )


GENERATE = {
    "temperature True": (dict(temperature=True), ValueError, "temperature must be a finite number"),
    "temperature '1'": (dict(temperature="1"), ValueError, "temperature must be a finite number"),
    "temperature -0.5": (dict(temperature=-0.5), ValueError, "got -0.5"),
    "temperature nan": (dict(temperature=float("nan")), ValueError, "got nan"),
    "top_k True": (dict(top_k=True), ValueError, "top_k must be a positive int"),
    "top_k 1.5": (dict(top_k=1.5), ValueError, "top_k must be a positive int"),
    "use_cache 'yes'": (dict(use_cache="yes"), TypeError, "use_cache must be a bool"),
    "generator 0": (dict(generator=0), TypeError, "generator must be a torch.Generator"),
    "max_new_tokens 1.5": (dict(max_new_tokens=1.5), ValueError, "max_new_tokens must be an int"),
    "max_new_tokens True": (dict(max_new_tokens=True), ValueError, "max_new_tokens must be an int"),
}


@pytest.mark.parametrize("kwargs, kind, match", GENERATE.values(), ids=GENERATE.keys())
@pytest.mark.parametrize("method", ["generate", "stream"])
def test_generate_and_stream_refuse_what_they_cannot_use(kwargs, kind, match, method):
    kwargs = {"max_new_tokens": 3, **kwargs}
    n = kwargs.pop("max_new_tokens")
    refuses(kind, match, getattr(gpt(), method), torch.zeros(1, 1, dtype=torch.long), n, **kwargs)


@pytest.mark.parametrize("tiny", [1e-45, 5e-324, 1e-30])
def test_a_temperature_that_underflows_samples_greedily(tiny):
    m, idx = gpt(), torch.randint(0, 11, (3, 2))
    greedy = m.generate(idx, 12, temperature=0)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(m.generate(idx, 12, temperature=tiny, generator=g), greedy)


def test_non_finite_weights_are_refused_when_generating():
    m = gpt()
    with torch.no_grad():
        m.lm_head.weight[3, 0] = float("nan")  # the tied embedding too
    refuses(
        ValueError, "logits are NaN or infinite", m.generate, torch.zeros(1, 1, dtype=torch.long), 2
    )


# --- the tokenizer and the data ----------------------------------------------------------------


TOKENIZER = {
    "-1": ([-1], ValueError, r"token ids \[-1\] are outside the vocabulary \[0, 3\)"),
    "3": ([3], ValueError, r"token ids \[3\] are outside"),
    "a tensor with -1": (torch.tensor([0, -1]), ValueError, r"\[-1\]"),
    "True": ([True], TypeError, "decode takes a list of int token ids"),
    "1.0": ([1.0], TypeError, "decode takes a list of int token ids"),
    "'a'": (["a"], TypeError, "decode takes a list of int token ids"),
    "a 2-D tensor": (torch.zeros(2, 2, dtype=torch.long), TypeError, "decode one row at a time"),
    "a float tensor": (torch.zeros(2), TypeError, "1-D integer tensor"),
    "a string": ("abc", TypeError, "decode takes a list of int token ids"),
}


@pytest.mark.parametrize("ids, kind, match", TOKENIZER.values(), ids=TOKENIZER.keys())
def test_decode_refuses_what_is_no_token_id(ids, kind, match):
    refuses(kind, match, CharTokenizer.from_text("abc").decode, ids)


def test_encode_tensor_is_encode():
    text = "héllo wörld 😀\n" * 10
    tok = CharTokenizer(list(reversed(sorted(set(text)))))  # ids not in code-point order
    assert tok.encode_tensor(text).tolist() == tok.encode(text)
    refuses(ValueError, "outside the vocabulary: '!'", tok.encode_tensor, "hé!")
    refuses(TypeError, "text must be a str", tok.encode_tensor, b"bytes")


@pytest.mark.parametrize(
    "train, match",
    [
        (torch.arange(100).float(), "torch.float32"),
        (torch.arange(100).int(), "torch.int32"),
        (torch.arange(100).view(10, 10), r"\(10, 10\)"),
        (list(range(100)), "must be a 1-D int64 tensor"),
    ],
    ids=["float", "int32", "2-D", "a list"],
)
def test_token_splits_refuse_what_batches_cannot_be_drawn_from(train, match):
    refuses(TypeError, match, TokenSplits, train, torch.arange(10))


def test_read_text_refuses_a_bad_limit():
    refuses(TypeError, "max_bytes must be an int", read_text, "x.txt", max_bytes=1.5)


# --- the KV cache ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, kind, match",
    [
        ((-1, 2, 8, 4), {}, ValueError, "batch_size must be a positive int, got -1"),
        ((1, 0, 8, 4), {}, ValueError, "n_heads must be a positive int, got 0"),
        ((1, 2, -8, 4), {}, ValueError, "max_len must be a positive int, got -8"),
        ((1, 2, 8, 0), {}, ValueError, "head_size must be a positive int, got 0"),
        ((1, 2, 8.0, 4), {}, TypeError, "max_len must be an int"),
        ((1, 2, 8, 4), {"dtype": torch.long}, TypeError, "dtype must be a floating-point"),
    ],
)
def test_a_kv_cache_of_no_size_is_refused(args, kwargs, kind, match):
    refuses(kind, match, KVCache, *args, **kwargs)


# --- the trainer ----------------------------------------------------------------------------


def splits():
    return TokenSplits(torch.arange(200) % 5, torch.arange(50) % 5)


CFG = TrainConfig(block_size=4, batch_size=2, max_iters=2, eval_interval=1, eval_iters=1)


class Returns(nn.Module):
    """A model whose forward returns ``make(logits, loss)``."""

    def __init__(self, make):
        super().__init__()
        self.table = nn.Embedding(5, 5)
        self.make = make

    def forward(self, idx, targets):
        logits = self.table(idx)  # (B, T, V)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return self.make(logits, loss)


MODELS = {
    "logits alone": (
        lambda lg, ls: lg,
        TypeError,
        r"must return \(logits, loss\), got a torch.float32 tensor of shape \(2, 4, 5\)",
    ),
    "loss None": (
        lambda lg, ls: (lg, None),
        TypeError,
        "must be a scalar float tensor .* got NoneType",
    ),
    "loss per token": (
        lambda lg, ls: (lg, lg.sum(-1)),
        TypeError,
        r"got a torch.float32 tensor of shape \(2, 4\)",
    ),
    "a dict": (
        lambda lg, ls: {"logits": lg, "loss": ls},
        TypeError,
        r"must return \(logits, loss\), got dict",
    ),
    "three values": (lambda lg, ls: (lg, ls, ls), TypeError, r"must return \(logits, loss\)"),
    "a detached loss": (lambda lg, ls: (lg, ls.detach()), ValueError, "does not require grad"),
}


@pytest.mark.parametrize("make, kind, match", MODELS.values(), ids=MODELS.keys())
def test_the_trainer_refuses_a_model_that_does_not_return_logits_and_loss(make, kind, match):
    refuses(kind, match, Trainer(Returns(make), splits(), CFG, progress=False).fit)


def test_the_evaluation_refuses_it_too():
    trainer = Trainer(Returns(lambda lg, ls: lg), splits(), CFG, progress=False)
    refuses(TypeError, r"must return \(logits, loss\)", trainer.estimate_loss)
    refuses(TypeError, r"must return \(logits, loss\)", trainer.validation_loss)
    refuses(TypeError, r"must return \(logits, loss\)", loss_of, torch.zeros(2, 4, 5))


TRAINER = {
    "model not a Module": (
        dict(model=lambda x, y: x),
        TypeError,
        "model must be a torch.nn.Module",
    ),
    "no parameters": (dict(model=nn.ReLU()), ValueError, "no trainable parameters"),
    "frozen parameters": (
        dict(model=nn.Linear(2, 2).requires_grad_(False)),
        ValueError,
        "no trainable",
    ),
    "data a tuple": (
        dict(data=(torch.arange(9), torch.arange(9))),
        TypeError,
        "data must be a gptblock.data.batches.TokenSplits",
    ),
    "config a dict": (dict(config={"max_iters": 2}), TypeError, "config must be a TrainConfig"),
    "out_dir an int": (dict(out_dir=3), TypeError, "out_dir must be a path or None"),
    "meta not JSON": (dict(meta={"when": object()}), TypeError, "meta must be JSON"),
    "meta with NaN": (dict(meta={"loss": float("nan")}), TypeError, "meta must be JSON"),
    "meta a list": (
        dict(meta=["x"]),
        TypeError,
        "meta must be a mapping of JSON fields or a RunMetadata",
    ),
    "device meta": (
        dict(config=TrainConfig(block_size=4, batch_size=2, device="meta")),
        ValueError,
        "device 'meta'",
    ),
    "device cuda:7": (
        dict(config=TrainConfig(block_size=4, batch_size=2, device="cuda:7")),
        ValueError,
        "device 'cuda:7'",
    ),
}


@pytest.mark.parametrize("change, kind, match", TRAINER.values(), ids=TRAINER.keys())
def test_the_trainer_refuses_arguments_it_cannot_use(change, kind, match):
    if "cuda" in match and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    args = {"model": Returns(lambda lg, ls: (lg, ls)), "data": splits(), "config": CFG, **change}
    model, data, config = args.pop("model"), args.pop("data"), args.pop("config")
    refuses(kind, match, Trainer, model, data, config, progress=False, **args)


def test_fit_and_callbacks_refuse_what_they_cannot_use(tmp_path):
    trainer = Trainer(Returns(lambda lg, ls: (lg, ls)), splits(), CFG, progress=False)
    refuses(TypeError, "resume must be a bool", trainer.fit, resume="yes")
    refuses(ValueError, "resume needs an out_dir", trainer.fit, resume=True)
    refuses(TypeError, "a callback must be callable", trainer.add_callback, "on_step_end", 3)


TRAIN_CONFIG = {
    "beta2 1.0": (dict(beta2=1.0), ValueError, r"beta2 must be in \[0, 1\), got 1.0"),
    "beta1 1.0": (dict(beta1=1.0), ValueError, r"beta1 must be in \[0, 1\), got 1.0"),
    "min_lr_ratio 1.5": (
        dict(min_lr_ratio=1.5),
        ValueError,
        r"min_lr_ratio must be in \[0, 1\], got 1.5",
    ),
    "seed 2**64": (dict(seed=2**64), ValueError, r"seed must be an int in \[0, 2\*\*63 - 1\]"),
    "seed -1": (dict(seed=-1), ValueError, r"seed must be an int in \[0, 2\*\*63 - 1\], got -1"),
    "seed 1.0": (dict(seed=1.0), TypeError, "seed must be an int"),
}


@pytest.mark.parametrize("kwargs, kind, match", TRAIN_CONFIG.values(), ids=TRAIN_CONFIG.keys())
def test_train_config_says_what_it_allows(kwargs, kind, match):
    refuses(kind, match, TrainConfig, **kwargs)


def test_the_edges_train_config_allows_are_allowed():
    TrainConfig(beta1=0.0, beta2=0.999999, min_lr_ratio=1.0, seed=2**63 - 1)


# --- the NumPy oracle ------------------------------------------------------------------------


def oracle_params():
    return reference.params_from_state_dict(TransformerBlock(16, 2).state_dict())


@pytest.mark.parametrize("eps", [0, 0.0, -1e-5, float("nan"), float("inf"), "1e-5", True, None])
def test_the_oracle_refuses_an_eps_that_is_not_positive(eps):
    x = np.zeros((1, 3, 16))
    with pytest.raises(ValueError, match="eps must be a finite float > 0"):
        reference.block_forward(oracle_params(), x, n_head=2, eps=eps)


def test_the_oracle_takes_a_numpy_eps_and_matches_the_block():
    block = TransformerBlock(16, 2, norm_eps=1e-3).double().eval()
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    params = reference.params_from_state_dict(block.state_dict())
    y, _ = reference.block_forward(params, x.numpy(), n_head=2, eps=np.float32(1e-3))
    with torch.no_grad():
        assert np.allclose(y, block(x).numpy(), atol=1e-6, rtol=0)


# --- the run's functions -----------------------------------------------------------------------


def test_sampling_refuses_a_prompt_or_seed_it_cannot_use():
    tok = CharTokenizer.from_text("ab")
    model = GPT(GPTConfig(tok.vocab_size, block_size=4, n_layer=1, n_head=1, n_embd=4))
    refuses(TypeError, "prompt must be a str", sample_text, model, tok, ["a"])
    refuses(
        ValueError,
        r"seed must be an int in \[0, 2\*\*63 - 1\]",
        sample_text,
        model,
        tok,
        "a",
        seed=2**64,
    )
    refuses(ValueError, "temperature", sample_text, model, tok, "a", temperature=-1)


def test_the_run_refuses_flags_that_are_not_flags(tmp_path):
    refuses(
        TypeError, "resume must be a bool", prepare_run, text="abc" * 100, out_dir=None, resume="no"
    )
    refuses(
        TypeError,
        "allow_other_data must be a bool",
        prepare_run,
        text="abc" * 100,
        out_dir=None,
        allow_other_data=1,
    )
    refuses(TypeError, "text must be a str", prepare_run, text=b"abc", out_dir=None)
    refuses(ValueError, "device 'meta'", load_gpt, tmp_path, device="meta")


def test_save_checkpoint_refuses_what_it_cannot_store(tmp_path):
    refuses(
        TypeError,
        r"tensors\['w'\] must be a torch.Tensor, got list",
        save_checkpoint,
        tmp_path,
        "last",
        {"w": [1.0]},
        {"step": 1},
    )
    refuses(
        ValueError,
        r"meta\['step'\] must be >= 0, got -1",
        save_checkpoint,
        tmp_path,
        "last",
        {},
        {"step": -1},
    )
    refuses(
        ValueError,
        "must not set the checkpoint's own fields",
        save_checkpoint,
        tmp_path,
        "last",
        {},
        {"step": 1, "sha256": "x"},
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    "n, kind", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (10**6, ValueError)]
)
def test_set_threads_refuses_what_would_fail_or_crash(n, kind):
    before = torch.get_num_threads()
    refuses(kind, "threads must be", set_threads, n)
    assert torch.get_num_threads() == before


def test_a_gpt_too_big_for_the_machine_is_refused_before_anything_is_allocated():
    # 8e14 parameters: the estimate and the machine's memory, not torch's allocator (issue 31)
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=64, n_head=4, n_embd=2**20)
    says = r"of 844,425,939,910,656 parameters .* needs about 3,145,731\.8 GiB but cpu has .* avail"
    with pytest.raises(UserError, match=says):
        GPT(config)


# --- the public functions name an argument of another type (issue 31, item 5) --------------------


def test_every_public_function_checks_its_arguments_types():
    import inspect

    import gptblock
    from gptblock import lens, sampling

    public = [getattr(gptblock, n) for n in gptblock.__all__]
    public += [getattr(m, n) for m in (lens, sampling) for n in m.__all__]
    functions = [f for f in public if inspect.isfunction(f)]
    assert len(functions) > 20 and all(hasattr(f, "__wrapped__") for f in functions)


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda g: g.load(5), "load: out_dir must be a str or a path or None, got 5 (int)"),
        (lambda g: g.load(hf=5), "load: hf must be a str or a path or None, got 5"),
        (lambda g: g.load(nanogpt=[]), "load: nanogpt must be a str or a path or None"),
        (lambda g: g.load(FIXTURE, device=5), "device must be a str or a torch.device, got 5"),
        (lambda g: g.load_gpt(FIXTURE, kind=None), "load_gpt: kind must be a str, got None"),
        (lambda g: g.train_gpt(out_dir=5), "out_dir must be a str or a path or None, got 5"),
        (lambda g: g.train_gpt(5), "train_gpt: data must be a str or a path or None, got 5"),
        (lambda g: g.lens.attention_figure(None), "inspection must be a PromptInspection"),
        (lambda g: g.lens.show_token(5), "show_token: text must be a str, got 5"),
        (lambda g: g.check_block(), "check_block: missing a required argument: 'target'"),
    ],
)
def test_a_public_function_names_an_argument_of_another_type(call, says):
    import gptblock

    with pytest.raises(UserError, match=re.escape(says)):
        call(gptblock)
