"""Building the block as the learner's file does (check/building/build.py, sizes.py, arguments.py): at the
sizes the file implies (module settings, constructor and config defaults, --arg) and at other
sizes; a config with a layer index, through **kwargs or with missing fields; a tuple output; and a
block that cannot be built or called, reported as what it raised, at the learner's line."""

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gptblock.check import check_block, load_target
from gptblock.check.serve.script import SKIPPED, definitions
from gptblock.errors import UserValueError

LECTURE = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    from torch.nn import functional as F

    # hyperparameters
    batch_size = 16
    block_size = 32
    max_iters = 5000
    learning_rate = 1e-3
    n_embd = 64
    n_head = 4
    n_layer = 4
    dropout = 0.0


    class Head(nn.Module):
        def __init__(self, head_size):
            super().__init__()
            self.key = nn.Linear(n_embd, head_size, bias=False)
            self.query = nn.Linear(n_embd, head_size, bias=False)
            self.value = nn.Linear(n_embd, head_size, bias=False)
            self.register_buffer('tril', torch.tril(torch.ones(block_size, block_size)))
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            B, T, C = x.shape
            k = self.key(x)
            q = self.query(x)
            wei = q @ k.transpose(-2, -1) * k.shape[-1]**-0.5
            wei = wei.masked_fill(self.tril[:T, :T] == 0, float('-inf'))
            wei = F.softmax(wei, dim=-1)
            wei = self.dropout(wei)
            v = self.value(x)
            return wei @ v


    class MultiHeadAttention(nn.Module):
        def __init__(self, num_heads, head_size):
            super().__init__()
            self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
            self.proj = nn.Linear(head_size * num_heads, n_embd)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            out = torch.cat([h(x) for h in self.heads], dim=-1)
            return self.dropout(self.proj(out))


    class FeedFoward(nn.Module):
        def __init__(self, n_embd):
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd),
                nn.Dropout(dropout),
            )

        def forward(self, x):
            return self.net(x)


    class Block(nn.Module):
        def __init__(self, n_embd, n_head):
            super().__init__()
            head_size = n_embd // n_head
            self.sa = MultiHeadAttention(n_head, head_size)
            self.ffwd = FeedFoward(n_embd)
            self.ln1 = nn.LayerNorm(n_embd)
            self.ln2 = nn.LayerNorm(n_embd)

        def forward(self, x):
            x = x + self.sa(self.ln1(x))
            x = x + self.ffwd(self.ln2(x))
            return x


    if __name__ == "__main__":  # the training script: not run when the checker imports the file
        raise SystemExit("training...")
    """
)

NANOGPT = textwrap.dedent(
    """
    from dataclasses import dataclass
    import torch
    import torch.nn as nn
    from torch.nn import functional as F


    @dataclass
    class GPTConfig:
        block_size: int = 64
        n_embd: int = 48
        n_head: int = 6
        dropout: float = 0.0
        bias: bool = True


    class CausalSelfAttention(nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            self.layer_idx = layer_idx
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
            self.n_head, self.n_embd = config.n_head, config.n_embd

        def forward(self, x, attention_mask=None, use_cache=False):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / (k.size(-1) ** 0.5)
            att = att.masked_fill(torch.ones(T, T).tril() == 0, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y), att  # (output, attention weights), as Hugging Face's layers


    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x)))


    class Block(nn.Module):
        def __init__(self, config: GPTConfig, layer_idx: int):
            super().__init__()
            self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.attn = CausalSelfAttention(config, layer_idx)
            self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.mlp = MLP(config)

        def forward(self, x, attention_mask=None, output_attentions=False):
            a, weights = self.attn(self.ln_1(x), attention_mask)
            x = x + a
            x = x + self.mlp(self.ln_2(x))
            return (x, weights) if output_attentions else (x,)
    """
)


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return str(path)


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # as the installed command runs: the working directory not on sys.path (``python -P``)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONSAFEPATH": "1"}
    cmd = [sys.executable, "-m", "gptblock", "check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=cwd)


def test_the_lecture_file_is_built_at_its_module_settings_and_checked_at_other_sizes(tmp_path):
    path = _file(tmp_path, "gpt", LECTURE)
    report = check_block(f"{path}:Block", isolate=False)
    assert report.passed, str(report)
    assert report.target == "Block(n_embd=64, n_head=4)"
    said = " ".join(report.notes)
    assert "n_embd=64, n_head=4, block_size=32 from gpt.py's module settings" in said
    assert "checked again at n_embd=48, n_head=6, block_size=16: PASS" in said
    Block = load_target(f"{path}:Block")
    module = inspect.getmodule(Block)
    check_block(Block)
    assert (module.n_embd, module.n_head, module.block_size) == (64, 4, 32)  # restored


def test_upper_case_settings_are_the_files_sizes_and_give_the_arg_line(tmp_path):
    # (s18 unseen set) the heads read EMBED_DIM = 64, the block takes emb_dim with no default:
    # built at the file's 64, not at a width of 32 that builds a 64-wide block it cannot run;
    # a width of another name with no default is asked for with the file's value
    text = LECTURE.replace("n_embd", "EMBED_DIM").replace("n_head = 4", "N_HEAD = 4")
    text = text.replace(
        "def __init__(self, EMBED_DIM, n_head):",
        "def __init__(self, emb_dim, n_head):\n        EMBED_DIM = emb_dim",
    )
    report = check_block(f"{_file(tmp_path, 'gpt', text)}:Block", isolate=False)
    assert report.passed and report.target == "Block(emb_dim=64, n_head=4)", str(report)
    said = " ".join(report.notes)
    assert "EMBED_DIM=64, N_HEAD=4, block_size=32 from gpt.py's module settings" in said
    path = _file(tmp_path, "gpt", text.replace("emb_dim", "model_width"))
    with pytest.raises(UserValueError, match=r"this builds it: --arg model_width=64$"):
        check_block(f"{path}:Block", isolate=False)


def test_required_arguments_named_as_module_settings_are_built_with_them(tmp_path):
    # (s58, a learner's file) Block(num_embeddings, head_count) as its script calls it, with
    # the settings of those names: names no size kind knows, built at the file's values
    text = LECTURE.replace("n_embd", "num_embeddings").replace("n_head", "head_count")
    report = check_block(f"{_file(tmp_path, 'gpt', text)}:Block", isolate=False)
    assert report.passed and report.target == "Block(num_embeddings=64, head_count=4)", str(report)
    said = " ".join(report.notes)
    assert "num_embeddings=64, head_count=4 from gpt.py's module settings of the same names" in said
    assert "checked again at num_embeddings=48 (C), head_count=6 (nh), block_size=16: PASS" in said
    # a setting named with num_ for the constructor's n_ (NUM_EMBD = 128 for n_embd)
    text = LECTURE.replace("n_embd = 64", "NUM_EMBD = 64").replace(
        "Linear(n_embd, head", "Linear(NUM_EMBD, head"
    )
    text = text.replace("num_heads, n_embd)", "num_heads, NUM_EMBD)")
    report = check_block(f"{_file(tmp_path, 'gpt', text)}:Block", isolate=False)
    assert report.passed and report.target == "Block(n_embd=64, n_head=4)", str(report)


def test_arg_wins_and_the_module_settings_follow_it(tmp_path):
    path = _file(tmp_path, "gpt", LECTURE)
    # the heads read n_embd from the module: built at 48 too, or the block would not fit
    report = check_block(f"{path}:Block", isolate=False, n_embd=48, n_head=6)
    assert report.passed and report.target == "Block(n_embd=48, n_head=6)", str(report)


def test_arg_changes_upper_case_module_settings_too(tmp_path):
    # (s87 unseen set) the heads read N_EMBD = 64; --arg n_embd=32 left it at 64: FAIL shape
    text = LECTURE.replace("Linear(n_embd, head_size", "Linear(N_EMBD, head_size")
    text = text.replace("n_embd = 64", "N_EMBD = 64").replace(
        "num_heads, n_embd)", "num_heads, N_EMBD)"
    )
    report = check_block(
        f"{_file(tmp_path, 'gpt', text)}:Block", isolate=False, n_embd=32, n_head=4
    )
    assert report.passed, str(report)


def test_an_mlp_width_no_multiple_of_the_width_is_made_smaller_in_proportion(tmp_path):
    # (s87 unseen set) Llama 2's 11008 kept at a width of 64: 45 s and 5 GB for one check
    text = LECTURE.replace("4 * n_embd", "d_ff").replace(
        "def __init__(self, n_embd):", "def __init__(self, n_embd, d_ff):"
    )
    text = text.replace(
        "def __init__(self, n_embd, n_head):", "def __init__(self, n_embd, n_head, d_ff=11008):"
    )
    text = text.replace("FeedFoward(n_embd)", "FeedFoward(n_embd, d_ff)")
    report = check_block(f"{_file(tmp_path, 'gpt', text)}:Block", isolate=False)
    said = " ".join(report.notes)
    assert report.passed and "made smaller for the check: d_ff=512 (hidden)" in said, str(report)


def test_a_config_head_count_of_its_own_name_is_the_files(tmp_path):
    # (s87 unseen set) num_attention_heads = 8, read as num -> n_attention_heads: built with 4
    text = NANOGPT.replace("n_head: int = 6", "num_attention_heads: int = 8").replace(
        "config.n_head", "config.num_attention_heads"
    )
    report = check_block(f"{_file(tmp_path, 'heads', text)}:Block", isolate=False)
    assert "num_attention_heads=8" in report.target, str(report)


def test_the_readmes_call_builds_a_lesson_named_block_by_its_own_names(tmp_path):
    # README: check_block(MyBlock, d_model=32, nhead=4), MyBlock taking n_embd and n_head
    Block = load_target(f"{_file(tmp_path, 'gpt', LECTURE)}:Block")
    report = check_block(Block, d_model=48, nhead=6)
    assert report.passed and report.target == "Block(n_embd=48, n_head=6)", str(report)
    # an argument the block has no place for (a typo) is left out, and the report says so
    assert "n_layers=2 left out" in " ".join(check_block(Block, n_layers=2).notes)


def test_the_lecture_file_passes_on_the_command_line(tmp_path):
    done = _cli(f"{_file(tmp_path, 'gpt', LECTURE)}:Block")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "from gpt.py's module settings" in done.stdout


def test_a_typo_in_forward_is_an_error_at_the_learners_line_not_the_shape_mistake(tmp_path):
    path = _file(tmp_path, "typo", LECTURE.replace("k = self.key(x)", "k = self.kee(x)"))
    said = r"AttributeError: 'Head' object has no attribute 'kee' \(at .*typo.py:\d+: k = self.kee\(x\)\)"
    with pytest.raises(
        UserValueError,
        match=r"cannot check Block\(n_embd=64, n_head=4\): calling it .* raised " + said,
    ):
        check_block(f"{path}:Block", isolate=False)
    done = _cli(f"{path}:Block")
    assert done.returncode == 2 and "shape" not in done.stdout, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("gptblock check: error: cannot check Block(") and "self.kee(x)" in line


def test_a_view_of_memory_a_transpose_left_is_an_error_not_the_shape_mistake(tmp_path):
    # heads merged by transpose(1, 2).view(...) without .contiguous(): torch names a size and a
    # stride, but every size is right: the learner's line and torch's advice, exit 2 (s101)
    text = NANOGPT.replace(
        ".transpose(1, 2).contiguous().view(B, T, C)", ".transpose(1, 2).view(B, T, C)"
    )
    done = _cli(f"{_file(tmp_path, 'nocontig', text)}:Block")
    assert done.returncode == 2 and "shape" not in done.stdout, done.stdout + done.stderr
    assert "Use .reshape(...) instead (at " in done.stderr and "nocontig.py:31: y = " in done.stderr


CALLABLE_DEFAULT = textwrap.dedent(
    """
    from dataclasses import dataclass
    from typing import Callable

    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


    @dataclass
    class Output:  # a dataclass, not a tuple or a dict
        hidden_states: torch.Tensor
        attentions: object = None


    @dataclass
    class Cfg:
        dim: int = 32
        n_heads: int = 4
        attn_func: Callable = attend  # a function of this file (open_lm's Params.attn_func)


    class Block(nn.Module):
        def __init__(self, args: Cfg):
            super().__init__()
            self.nh, self.fn = args.n_heads, args.attn_func
            self.qkv, self.o = nn.Linear(args.dim, 3 * args.dim), nn.Linear(args.dim, args.dim)
            self.ln1, self.ln2 = nn.LayerNorm(args.dim), nn.LayerNorm(args.dim)
            self.fc, self.proj = nn.Linear(args.dim, 4 * args.dim), nn.Linear(4 * args.dim, args.dim)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, self.nh, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, -1))
            x = x + self.o(self.fn(q, k, v).transpose(1, 2).reshape(B, T, C))
            return Output(x + self.proj(F.gelu(self.fc(self.ln2(x)))))
    """
)


def test_a_config_holding_a_function_of_the_file_and_a_dataclass_output(tmp_path):
    # (s103 unseen set) the function was pickled by its module's name, which the runner's fresh
    # process does not have: "No module named '_gptblock_check_...'"; a dataclass output was
    # refused ("the block returned a Output, expected a (B, T, C) tensor")
    done = _cli(f"{_file(tmp_path, 'callable_default', CALLABLE_DEFAULT)}:Block")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "returns a Output: its 'hidden_states', the (B, T, C) tensor" in done.stdout


REGISTRY = textwrap.dedent(
    """
    import torch
    import torch.nn as nn


    class GPTBlock(nn.Module):
        def __init__(self, d_model, n_heads, ctx_len, **unused):
            super().__init__()
            self.n_heads, self.norm1, self.norm2 = n_heads, nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
            self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
            self.register_buffer("mask", torch.ones(ctx_len, ctx_len).triu(1).bool())

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.reshape(B, T, self.n_heads, -1).transpose(1, 2) for t in self.qkv(self.norm1(x)).chunk(3, -1))
            s = (q @ k.transpose(-1, -2) / q.size(-1) ** 0.5).masked_fill(self.mask[:T, :T], float("-inf"))
            x = x + self.out((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))
            return x + self.mlp(self.norm2(x))


    BLOCKS = {"gpt": GPTBlock}


    def build_block(cfg: dict):  # a plain dict, its keys the block's arguments
        cfg = dict(cfg)
        return BLOCKS[cfg.pop("block", "gpt")](**cfg)
    """
)


def test_a_factory_taking_a_dict_is_given_one_and_asks_for_what_its_block_needs(tmp_path):
    # (s103 unseen set) given a namespace, ``dict(cfg)`` raised at the learner's line; the
    # arguments the block then lacks are asked for by name, with values that build it
    path = _file(tmp_path, "registry", REGISTRY)
    done = _cli(f"{path}:build_block")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "its cfg needs d_model, n_heads, ctx_len" in done.stderr, done.stderr
    given = [a for kv in ("d_model=32", "n_heads=4", "ctx_len=16") for a in ("--arg", kv)]
    done = _cli(f"{path}:build_block", *given)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_config_with_a_layer_index_and_a_tuple_output(tmp_path):
    path = _file(tmp_path, "nanogpt", NANOGPT)
    report = check_block(f"{path}:Block", isolate=False)
    assert report.passed, str(report)
    assert report.target.startswith("Block(layer_idx=0, config=GPTConfig(block_size=64, n_embd=48")
    said = " ".join(report.notes)
    assert "n_embd=48, n_head=6, block_size=64 from the config's defaults" in said
    assert "returns a tuple: its element 0, the (B, T, C) tensor, is taken as its output" in said
    assert "checked again at n_embd=24, n_head=2, block_size=16: PASS" in said


def test_a_dict_output_is_read_by_its_first_tensor_of_the_input_shape():
    import torch.nn as nn

    from gptblock import lesson

    class Returns(lesson.Block):
        def forward(self, x, mask=None):  # a dict, as a ModelOutput is
            return {"attentions": None, "hidden_states": super().forward(x)}

    report = check_block(Returns, n_embd=16, n_head=2)
    assert report.passed and isinstance(Returns(16, 2, 8), nn.Module), str(report)
    assert any("returns a dict: its 'hidden_states'" in n for n in report.notes)


def test_a_config_whose_fields_come_through_kwargs(tmp_path):
    kwargs = NANOGPT.replace(
        "@dataclass\nclass GPTConfig:",
        "class Config:\n    def __init__(self, **kw):\n        self.__dict__.update(kw)\n\n\n"
        "class Unused:",
    ).replace("config: GPTConfig", "config: Config")
    report = check_block(f"{_file(tmp_path, 'kw', kwargs)}:Block", isolate=False)
    assert report.passed and "config=Config(bias=True, n_embd=32" in report.target, report.target


def test_a_class_of_sizes_read_as_globals_is_made_smaller(tmp_path):
    # (s76 unseen set: a homework's ``class Config: n_embd = 768`` read as ``Config.n_embd``) the
    # block was checked at 768 channels, not made smaller (67 s)
    dataclass = NANOGPT[NANOGPT.index("@dataclass") : NANOGPT.index("class CausalSelfAttention")]
    text = NANOGPT.replace(
        dataclass,
        "class Config:\n    n_embd = 768\n    n_head = 12\n    block_size = 32\n"
        "    bias = True\n    dropout = 0.0\n\n\n",
    ).replace(
        "def __init__(self, config: GPTConfig, layer_idx: int):",
        "def __init__(self, layer_idx: int = 0):\n        config = Config",
    )
    report = check_block(f"{_file(tmp_path, 'homework', text)}:Block", isolate=False)
    said = " ".join(" ".join(report.notes).split())
    assert report.passed and "n_embd=768, n_head=12, block_size=32 from homework.py" in said, said
    assert "made smaller for the check: n_embd=192" in said, said


def test_a_class_of_sizes_the_code_calls_is_changed_as_a_class(tmp_path):
    # (s90 unseen set: ``Block(GPTConfig())`` of ``class GPTConfig: n_embd = 32``) at other sizes the
    # class was replaced by a namespace: "cannot build make(): ... object is not callable"
    dataclass = NANOGPT[NANOGPT.index("@dataclass") : NANOGPT.index("class CausalSelfAttention")]
    text = (
        NANOGPT.replace(
            dataclass,
            "class GPTConfig:\n    n_embd = 32\n    n_head = 4\n    block_size = 16\n"
            "    bias = True\n    dropout = 0.0\n\n\n",
        )
        + "\n\ndef make():\n    return Block(GPTConfig(), 0)\n"
    )
    report = check_block(f"{_file(tmp_path, 'made', text)}:make")
    said = " ".join(" ".join(report.notes).split())
    assert report.passed and "checked again at n_embd=48, n_head=3, block_size=24: PASS" in said, (
        said
    )


def test_a_setting_named_as_an_argument_given_follows_it(tmp_path):
    # (s94 unseen set: a file's ``d_ff = 3072`` beside ``Block(d_model, nhead, d_ff)`` checked with
    # --arg d_ff=256) the notes said "made smaller: d_ff=512" and "again at ... d_ff=384", never built
    text = (
        "import torch\nimport torch.nn as nn\n\n\nclass Block(nn.Module):\n"
        "    def __init__(self, d_model, nhead, d_ff):\n        super().__init__()\n"
        "        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)\n"
        "        self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)\n"
        "        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))\n\n"
        "    def forward(self, x):\n        T = x.size(1)\n"
        "        hide = torch.ones(T, T, dtype=torch.bool).triu(1)\n        h = self.ln1(x)\n"
        "        x = x + self.attn(h, h, h, attn_mask=hide, need_weights=False)[0]\n"
        "        return x + self.mlp(self.ln2(x))\n\n\nd_ff = 3072\n"
    )
    args = {"d_model": 64, "nhead": 4, "d_ff": 256}
    report = check_block(f"{_file(tmp_path, 'ff', text)}:Block", **args)
    said = " ".join(" ".join(report.notes).split())
    assert report.passed and "made smaller" not in said, said
    assert "checked again at d_model=48, nhead=6, d_ff=192 (4C): PASS" in said, said


def test_sizes_read_from_a_settings_module_the_file_imports(tmp_path):
    # (s83 unseen set: the lecture split into files, ``import hyperparameters as hp``) the heads
    # read hp.n_embd = 384 while the checker built Block(n_embd=32): a false FAIL shape
    (tmp_path / "hparams.py").write_text("n_embd = 384\nn_head = 6\nblock_size = 32\n")
    text = LECTURE[: LECTURE.index("# hyperparameters")] + "import hparams as hp\ndropout = 0.0\n"
    text += LECTURE[LECTURE.index("\n\nclass Head") :]
    for old in ("nn.Linear(n_embd, head_size", "head_size * num_heads, n_embd)"):
        text = text.replace(old, old.replace("n_embd", "hp.n_embd"))
    text = text.replace(
        "torch.ones(block_size, block_size)", "torch.ones(hp.block_size, hp.block_size)"
    )
    # the heads in a sibling file, as that learner's: only they import hparams
    split = text.index("\n\nclass Block")
    (tmp_path / "heads.py").write_text(text[:split])
    block = "from heads import *\n" + text[split:]
    for name, code in (("model", text), ("block", block)):
        report = check_block(f"{_file(tmp_path, name, code)}:Block")
        said = " ".join(" ".join(report.notes).split())
        assert report.passed and "n_embd=384, n_head=6" in said and "n_embd=96 " in said, said
        assert "checked again at" in said and ": PASS" in said, said


def test_a_config_class_whose_fields_are_its_init_parameters(tmp_path):
    # (s64 unseen set) minGPT's old GPTConfig: class values and ``__init__(self, vocab_size,
    # block_size, **kwargs)``; before: a namespace was built and its fields asked for one by one
    dataclass = NANOGPT[NANOGPT.index("@dataclass") : NANOGPT.index("class CausalSelfAttention")]
    mingpt = NANOGPT.replace(
        dataclass,
        "class GPTConfig:\n    dropout = 0.0\n\n"
        "    def __init__(self, vocab_size, block_size, bias=True, **kwargs):\n"
        "        self.vocab_size, self.block_size, self.bias = vocab_size, block_size, bias\n"
        "        self.__dict__.update(kwargs)\n\n\n",
    ).replace("config: GPTConfig", "config")
    path = _file(tmp_path, "mingpt", mingpt)
    with pytest.raises(UserValueError, match="its GPTConfig config needs vocab_size, which"):
        check_block(f"{path}:Block", isolate=False)
    report = check_block(f"{path}:Block", isolate=False, vocab_size=65, n_embd=32, n_head=4)
    assert report.passed and "config=GPTConfig(vocab_size=65, block_size=16" in report.target, str(
        report
    )
    # a plain helper class whose __init__ takes sizes is not a config: the dataclass is
    helper = (
        "class KVCache:\n    def __init__(self, max_batch_size, max_seq_len, n_heads, head_dim):"
    )
    helper += "\n        self.k = None\n\n\n"
    text = NANOGPT.replace("@dataclass", helper + "@dataclass", 1).replace(
        "config: GPTConfig", "config"
    )
    report = check_block(f"{_file(tmp_path, 'helper', text)}:Block", isolate=False)
    assert report.passed and "config=GPTConfig(" in report.target, str(report)


def test_a_dataclass_config_missing_required_fields_is_refused_naming_them(tmp_path):
    missing = NANOGPT.replace("block_size: int = 64", "block_size: int\n    vocab_size: int")
    path = _file(tmp_path, "missing", missing)
    said = r"cannot build Block: its GPTConfig config needs vocab_size, .*--arg vocab_size=64"
    with pytest.raises(UserValueError, match=said):
        check_block(f"{path}:Block", isolate=False)
    report = check_block(f"{path}:Block", isolate=False, vocab_size=50)
    assert report.passed and "block_size=16" in report.target, str(report)  # the checker's


def test_constructor_defaults_give_the_size():
    from gptblock import lesson

    class Defaults(lesson.Block):
        def __init__(self, n_embd=48, n_head=6, block_size=8):
            super().__init__(n_embd, n_head, block_size)

    report = check_block(Defaults)
    assert report.passed and "n_embd=48, n_head=6" in report.target, str(report)
    said = " ".join(report.notes)
    assert "n_embd=48, n_head=6, block_size=8 from the constructor's defaults" in said
    assert "checked again at n_embd=24, n_head=2, block_size=16: PASS" in said


def test_right_only_at_the_files_sizes_fails_naming_the_other_sizes(tmp_path):
    # the scale written as the file's head size (64 / 4 = 16): right there, wrong at hs 8
    fixed = LECTURE.replace("k.shape[-1]**-0.5", "16**-0.5")
    report = check_block(f"{_file(tmp_path, 'fixed', fixed)}:Block", isolate=False)
    assert report.verdict == "FAIL", str(report)
    (other,) = [f for f in report.findings if not f.passed]
    assert other.name == "other sizes"
    assert other.message.startswith(
        "PASS at n_embd=64, n_head=4, block_size=32; at n_embd=48, n_head=6, block_size=16: FAIL"
    )


def test_a_width_fixed_in_the_code_is_checked_at_the_files_sizes_only(tmp_path):
    fixed = LECTURE.replace("self.ln1 = nn.LayerNorm(n_embd)", "self.ln1 = nn.LayerNorm(64)")
    report = check_block(f"{_file(tmp_path, 'fixed', fixed)}:Block", isolate=False)
    assert report.passed, str(report)
    assert any(
        n.startswith("checked at the file's sizes only: at other sizes") for n in report.notes
    )


def test_a_block_that_raises_only_when_batch_and_time_differ_is_still_the_shape_mistake():
    import torch

    from gptblock import lesson

    class BatchAsTime(lesson.Block):
        def forward(self, x):
            B, T, C = x.shape
            return super().forward(x) + torch.zeros(B, B, 1)  # fits only when B == T

    report = check_block(BatchAsTime, n_embd=16, n_head=2)
    assert report.diagnosis == ["shape"], str(report)
    assert "only works when the batch size equals the sequence length" in str(report)


def test_a_size_error_on_every_call_is_still_the_shape_mistake():
    import torch

    from gptblock import lesson

    class CatAlongTime(lesson.Block):
        def forward(self, x):
            return x + torch.cat([x, x], dim=1)  # (B, 2T, C): never fits

    report = check_block(CatAlongTime, n_embd=16, n_head=2)
    assert report.diagnosis == ["shape"], str(report)


def test_a_size_related_build_failure_gives_the_arg_line_that_builds_it(tmp_path):
    rotary = textwrap.dedent(
        """
        import torch.nn as nn
        from gptblock import lesson


        class Rotary(nn.Module):
            def __init__(self, dim):
                super().__init__()
                assert dim % 16 == 0, "the rotary dimension must be a multiple of 16"


        class Block(lesson.Block):
            def __init__(self, n_embd, n_head):
                super().__init__(n_embd, n_head, 16)
                self.rotary = Rotary(n_embd // n_head)
        """
    )
    path = _file(tmp_path, "rotary", rotary)
    said = (
        r"cannot build Block\(n_embd=32, n_head=4\): AssertionError: the rotary dimension must "
        r"be a multiple of 16 \(at .*rotary.py:\d+: assert dim % 16 == 0.*\); it builds with "
        r"--arg n_embd=48 --arg n_head=3"
    )
    with pytest.raises(UserValueError, match=said):
        check_block(f"{path}:Block", isolate=False)


# Forwards written the way attention layers and Hugging Face layers take more than the input:
# forward(query, key, value) as nn.MultiheadAttention, position_ids and an Optional layer_past
# as GPT-2's / Llama's decoder layers, a mask as the seq2seq tutorials' layers.
def test_forward_arguments_whose_meaning_is_clear_are_filled_and_said():
    from gptblock import lesson

    class Layer(lesson.Block):
        def forward(self, query, key, value, position_ids, layer_past: dict | None):
            if position_ids.shape != (1, query.shape[1]) or layer_past is not None:
                raise ValueError("not as Hugging Face passes them")
            return super().forward(query) + 0 * (key - value).sum()

    report = check_block(Layer, n_embd=16, n_head=2)
    assert report.passed, str(report)
    assert report.notes[0] == (
        "forward(query, key, value, position_ids, layer_past) called with key = value = the "
        "input, position_ids=torch.arange(T) as (1, T), layer_past=None"
    )


def test_a_required_mask_is_refused_naming_it_and_the_wrapper():
    from gptblock import lesson

    class Masked(lesson.Block):
        def forward(self, x, trg_mask):
            return super().forward(x)

    with pytest.raises(UserValueError, match=r"its forward needs trg_mask besides the input, which "
                       r"the checker cannot make up \(a mask keeps or hides positions by the block's "
                       r"own convention, bool or added\); check a module whose forward\(x\) calls it"):  # fmt: skip
        check_block(Masked, n_embd=16, n_head=2)


def test_every_input_a_forward_needs_is_named_at_once():
    from gptblock import lesson

    class Meta(lesson.Block):  # Meta's Llama 2 layer: forward(x, start_pos, freqs_cis), and more
        def forward(self, x, start_pos, freqs_complex, alibi):
            return super().forward(x)

    said = r"its forward needs freqs_complex, alibi besides the input, which the checker cannot "
    with pytest.raises(UserValueError, match=said + r"make up \(it cannot tell what they hold\)"):
        check_block(Meta, n_embd=16, n_head=2)


def test_a_forward_that_needs_start_pos_starts_the_sequence_at_0():
    from gptblock import lesson

    class Meta(lesson.Block):  # (s65 unseen set) Meta's forward(x, start_pos): was refused
        def forward(self, x, start_pos):
            if start_pos != 0:
                raise ValueError(f"start_pos={start_pos!r}")
            return super().forward(x)

    report = check_block(Meta, n_embd=16, n_head=2)
    assert report.passed and "forward(x, start_pos) called with start_pos=0" in report.notes, str(
        report
    )


def test_forward_arguments_are_filled_alike_in_the_runner_process(tmp_path):
    # Isolated, the block is built twice (builder, runner): both must call it alike, or every
    # answer the verdict rests on is a TypeError.
    text = textwrap.dedent(
        """
        from gptblock import lesson

        class Layer(lesson.Block):
            def forward(self, hidden_states, position_ids):
                if position_ids.shape != (1, hidden_states.shape[1]):
                    raise ValueError("not as Hugging Face passes them")
                return super().forward(hidden_states)
        """
    )
    report = check_block(f"{_file(tmp_path, 'hf_style', text)}:Layer", n_embd=16, n_head=2)
    assert report.passed, str(report)
    assert "position_ids=torch.arange(T) as (1, T)" in report.notes[0]


def test_arguments_go_to_the_parameter_of_their_role_or_are_left_out():
    # the README's example, on the lesson's names (issue 29): d_model and nhead reach n_embd and
    # n_head; an argument the block has no place for is left out, each said in a note
    from gptblock import lesson

    report = check_block(lesson.Block, d_model=16, nhead=2, bias=False)
    assert report.passed, report
    assert "n_embd=16, n_head=2" in report.target
    notes = " ".join(report.notes)
    assert "d_model=16 given to Block's n_embd" in notes and "bias=False left out" in notes


def test_a_class_of_main_is_sent_as_its_source_and_what_it_uses(tmp_path, monkeypatch):
    import types

    from gptblock.check.building.target import main_source

    path = tmp_path / "cell.py"  # a cell: linecache reads it by its code's file name
    path.write_text(
        "import torch.nn as nn\n"
        "from gptblock import lesson\n"
        "W, unused = 16, 1\n"
        "class Inner(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.b = lesson.Block(W, 2, 8)\n"
        "Alias = Inner\n"
        "class Outer(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.i = Alias()\n"
    )
    main = types.ModuleType("__main__")
    exec(compile(path.read_text(), str(path), "exec"), vars(main))
    monkeypatch.setitem(sys.modules, "__main__", main)
    source = main_source(main.Outer)
    assert "unused" not in source and main_source(load_target("gptblock.lesson:Block")) is None
    fresh: dict[str, object] = {}
    exec(source, fresh)  # another process's view: nothing of this one's __main__
    assert sum(p.numel() for p in fresh["Outer"]().parameters()) == 12 * 16 * 16 + 10 * 16


def test_the_argument_helpers_guess_fit_and_parse():
    from gptblock import lesson
    from gptblock.check.building.arguments import _index, fit_arguments, guess
    from gptblock.check.building.build import check_sizes
    from gptblock.check.building.target import check_spec, parse_role

    assert (guess("n_layer"), guess("layer_idx"), guess("max_seq_len")) == (1, 0, 16)
    # a head size is the width's share of a head; key/value heads a group of two, so that the
    # grouping is checked (not as many as the heads: that is no grouping)
    sizes = {"n_embd": 48, "n_head": 6}
    assert [guess(n) for n in ("head_dim", "d_k", "n_kv_heads", "num_key_value_heads")] == [
        8, 8, 2, 2,
    ]  # fmt: skip
    assert [guess(n, sizes=sizes) for n in ("head_dim", "n_kv_heads")] == [8, 3]
    assert guess("n_kv_heads", sizes={"n_head": 3}) == 1
    given = {"d_model": 32, "nhead": 4, "bias": False}
    assert fit_arguments(lesson.Block, given)[0] == {"n_embd": 32, "n_head": 4}
    assert (_index("layer_idx"), _index("layer_number"), _index("n_layer")) == (0, 1, None)
    assert parse_role("ln1=norm_a") == ("ln1", "norm_a")
    assert check_spec("gptblock.lesson:Block") == ("gptblock.lesson", "Block", False)
    with pytest.raises(UserValueError) as raised:
        check_sizes({"n_embd": 32, "n_head": 3}, {"n_head": 3})
    assert str(raised.value) == (
        "--arg n_head=3: n_embd=32 is not divisible by n_head=3 (each head gets n_embd / n_head "
        "channels); give one of 1, 2, 4, 8, 16, 32"
    )
    # an MLP's width is not C; single letters; no number invented for a name or type that says none
    names = ("d_ff", "dim_ff", "emb_size", "d", "H", "T", "ffn_mult", "mlp_ratio")
    assert [guess(n) for n in names] == [128, 128, 32, 32, 4, 16, 4, 4]
    assert (guess("rope"), guess("feed_forward"), guess("n", Path)) == (None, None, None)
    # (s21 unseen set) a rotary module is asked for, not given a number; a letter is the file's
    assert (guess("rotary_embeddings"), guess("rope_theta"), guess("rotary_dim")) == (
        None,
        None,
        8,
    )  # a rotation as wide as a head, not the width
    assert (guess("d", sizes={"n_embd": 64}), guess("T", sizes={"block_size": 8})) == (64, 8)
    # (s57) a flag is no multiplier, a fraction of a head no factor of 4, a position count a length
    names = ("multi_query", "partial_rotary_factor", "rotary_emb_base", "max_position_embeddings")
    assert [guess(n, sizes={"block_size": 8}) for n in names] == [None, None, None, 8]


def test_a_width_called_d_is_built_at_the_files_width(tmp_path):
    # (s21 unseen set) ``__init__(self, d)``: d is a width, the file's n_embd = 64 (was d=32)
    text = LECTURE.replace("def __init__(self, n_embd, n_head):", "def __init__(self, d, n_head):")
    text = text.replace(
        "head_size = n_embd // n_head", "n_embd = d\n        head_size = n_embd // n_head"
    )
    report = check_block(f"{_file(tmp_path, 'gpt', text)}:Block", isolate=False)
    assert report.passed and "d=64" in report.target, str(report)


UNREPEATED = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Rotary(nn.Module):  # its d_model is a head's size
    def __init__(self, d_model):
        super().__init__()
        self.d_model = d_model


class Block(nn.Module):
    def __init__(self, k, n_head, n_kv_head):
        super().__init__()
        self.n_head, self.n_kv_head, self.hs = n_head, n_kv_head, k // n_head
        self.ln_1, self.ln_2 = nn.RMSNorm(k), nn.RMSNorm(k)
        self.rope = Rotary(self.hs)
        self.q, self.proj = nn.Linear(k, k, bias=False), nn.Linear(k, k)
        self.kv = nn.Linear(k, 2 * n_kv_head * self.hs, bias=False)
        self.mlp = nn.Sequential(nn.Linear(k, 4 * k), nn.GELU(), nn.Linear(4 * k, k))

    def attn(self, x):
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.hs).transpose(1, 2)
        k, v = self.kv(x).view(B, T, 2 * self.n_kv_head, self.hs).transpose(1, 2).chunk(2, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # kv heads never repeated
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))
"""


def test_a_block_failing_at_its_width_is_called_there_not_at_an_attributes(tmp_path):
    # (s74 unseen set: a chess GPT) a width named k that no call takes (key/value heads never
    # repeated) was called at a rotary's d_model = 16: its norm's error, not the learner's line.
    # An unused ``import torch`` is no statement "not run" to tell of.
    path = _file(tmp_path, "gqa", UNREPEATED)
    report = check_block(f"{path}:Block", k=64, n_head=4, n_kv_head=2)
    said = str(report)
    assert "(6, 6, 64) input raised RuntimeError" in said and "is_causal=True)" in said, said
    assert "top-level" not in " ".join(report.notes), said
    assert check_block(f"{path}:Block", k=64, n_head=4, n_kv_head=4).passed


def _refusal(block, **kwargs):
    """The one-line error ``check_block`` refuses ``block`` with."""
    with pytest.raises(UserValueError) as raised:
        check_block(block, **kwargs)
    return str(raised.value)


def test_a_part_given_as_an_argument_is_asked_for_never_guessed():
    """A block taking its attention module: no ``--arg attention=1`` line (which builds it, to
    fail in its first call and be blamed on the learner's line)."""
    from gptblock import lesson

    class Takes(lesson.Block):
        def __init__(self, n_embd, n_head, attention):
            super().__init__(n_embd, n_head)
            self.attention = attention

    said = _refusal(Takes)
    assert said.endswith(
        "it needs attention, which --arg does not give; give each with --arg NAME=VALUE (a Python "
        "literal); a tensor or a module cannot be given so: check a function that builds the "
        "block with it"
    ), said


def test_a_parameter_the_constructor_reads_as_a_config_is_one_whatever_its_name(tmp_path):
    """(s96 unseen set) ``Block(c)`` reading ``c["d_model"]``: "it needs c, which --arg does not
    give", the --arg values given dropped; a tensor the constructor reads ``.shape`` of is none."""
    text = textwrap.dedent(
        """
        import torch.nn as nn
        from gptblock import lesson

        class Block(lesson.Block):
            def __init__(self, c):
                super().__init__(c["d_model"], c["n_heads"], c.get("block_size", 16))

        class Named(lesson.Block):
            def __init__(self, h):
                super().__init__(h.n_embd, h.n_head, 16)

        class Masked(lesson.Block):
            def __init__(self, mask):
                super().__init__(32, 4, mask.shape[0])
        """
    )
    path = _file(tmp_path, "c", text)
    report = check_block(f"{path}:Block", d_model=64, n_heads=4)
    assert report.passed and "'d_model': 64, " in report.target, str(report)  # a dict of them
    assert "'n_heads': 4, " in report.target, str(report)
    assert check_block(f"{path}:Named").passed
    assert "it needs mask, which --arg does not give" in _refusal(f"{path}:Masked")


def test_a_layer_index_given_to_the_constructor_stays_out_of_its_config(tmp_path):
    """(s98 unseen set) ``Layer(layer_id, config: Config)`` with ``--arg layer_id=0``: the config
    was a namespace holding layer_id too, as if the learner's class had been replaced."""
    text = textwrap.dedent(
        """
        from gptblock import lesson

        class Config:
            def __init__(self, dim=32, n_heads=4):
                self.dim, self.n_heads = dim, n_heads

        class Layer(lesson.Block):
            def __init__(self, layer_id, config: Config):
                super().__init__(config.dim, config.n_heads, 16)
        """
    )
    report = check_block(f"{_file(tmp_path, 'layer', text)}:Layer", layer_id=0)
    assert report.passed and "layer_id=0, config=Config(" in report.target, report.target
    assert "layer_id" not in report.target.split("config=")[1], report.target


class _ShortTable(nn.Module):
    """A correct modern block whose rotary table has ``block_size`` rows, a default of 8, and
    nothing square to tell its longest sequence by."""

    def __init__(self, n_embd=32, n_head=4, block_size=8):
        super().__init__()
        self.nh, hs = n_head, n_embd // n_head
        self.n1, self.n2 = nn.RMSNorm(n_embd, eps=1e-5), nn.RMSNorm(n_embd, eps=1e-5)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(n_embd, n_embd, bias=False) for _ in "qkvo")
        self.w1, self.w3 = nn.Linear(n_embd, 64, bias=False), nn.Linear(n_embd, 64, bias=False)
        self.w2 = nn.Linear(64, n_embd, bias=False)
        angle = torch.arange(block_size)[:, None] * 10000.0 ** (-torch.arange(0, hs, 2) / hs)
        self.register_buffer("cos", angle.cos())  # (block_size, hs / 2)
        self.register_buffer("sin", angle.sin())

    def rope(self, x, T):
        c, s, even, odd = self.cos[:T], self.sin[:T], x[..., 0::2], x[..., 1::2]
        return torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2)

    def forward(self, x):
        B, T, C = x.shape
        h = self.n1(x)
        q, k, v = (
            w(h).view(B, T, self.nh, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        y = F.scaled_dot_product_attention(self.rope(q, T), self.rope(k, T), v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def test_the_longest_sequence_is_the_constructors_default_too(tmp_path):
    # (s99 unseen set) UNVERIFIED: the conditions called it at T = 16, beyond its 8-row table
    head = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
    path = _file(tmp_path, "table", head + inspect.getsource(_ShortTable))
    report = check_block(f"{path}:_ShortTable")
    assert report.verdict == "PASS", str(report)


def test_a_config_block_that_raises_while_building_says_what_and_where():
    """Not only "give the config's fields": the exception and the learner's line (s17 unseen
    set, cy_llama: a 7-argument call to a 6-argument constructor)."""
    import dataclasses

    import torch

    @dataclasses.dataclass
    class Cfg:
        d_model: int = 32
        n_head: int = 4

    class Sub(torch.nn.Module):
        def __init__(self, a):
            super().__init__()

    class Broken(torch.nn.Module):
        def __init__(self, config: Cfg):
            super().__init__()
            self.sub = Sub(config.d_model, 1)

    said = _refusal(Broken)
    assert "building it raised TypeError: " in said and "self.sub = Sub(config.d_model, 1))" in said

    class Flagged(torch.nn.Module):  # energy_gpt's: a field no name says the value of
        def __init__(self, config):
            super().__init__()
            self.proj = torch.nn.Linear(config.n_embd, config.n_embd)
            self.plus_one = config.tril_plus_one

    with pytest.raises(UserValueError, match="its config needs tril_plus_one, which --arg does"):
        check_block(Flagged)

    class Bigcode(torch.nn.Module):  # s26, GPTBigCode: fields with a value to suggest, then not
        def __init__(self, config):
            super().__init__()
            self.c_fc = torch.nn.Linear(config.hidden_size, config.n_inner)
            self.scale = config.scale_attn_weights

    said = _refusal(Bigcode)
    assert said.endswith(
        "give each with --arg NAME=VALUE (a Python literal), e.g. --arg hidden_size=32 --arg "
        "n_inner=128 and a value for scale_attn_weights; a tensor or a module cannot be given so: "
        "check a function that builds the block with it"
    ), said


def test_a_config_read_as_a_dict_is_built_as_one():
    """``config["n_embd"]`` (s18 unseen set, einops_vit): a dict of the --arg values, not a
    namespace that cannot be subscripted; a key nobody gave is asked for with a value."""
    import torch

    class DictBlock(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.proj = torch.nn.Linear(config["n_embd"], config["n_embd"])
            self.drop = torch.nn.Dropout(config["hidden_dropout_prob"])

        def forward(self, x):
            return x + self.drop(self.proj(x))

    said = _refusal(DictBlock)
    assert said.endswith(
        "its config needs hidden_dropout_prob, which --arg does not give; this builds it: "
        "--arg hidden_dropout_prob=0.1"  # a dropout on: one left on in eval mode shows
    ), said
    report = check_block(DictBlock, hidden_dropout_prob=0.0)
    assert "config={'bias': True, 'n_embd': 32" in report.target, str(report)


def test_a_key_value_head_count_without_a_default_is_asked_for_grouped(tmp_path):
    # ``--arg n_kv_head=4`` (as many as the heads) built an ungrouped block: a learner who took the
    # suggested line got PASS for keys tiled in the wrong order. Half the heads shows it.
    text = (Path(__file__).parent / "zoo_modern" / "blocks" / "gqa_lesson.py").read_text()
    text = text.replace("k = k.repeat_interleave(group, dim=1)", "k = k.repeat(1, group, 1, 1)")
    text = text.replace("v = v.repeat_interleave(group, dim=1)", "v = v.repeat(1, group, 1, 1)")
    text = text.replace(
        "def __init__(self, n_embd=32, n_head=4, n_kv_head=2, block_size=16):",
        "def __init__(self, n_kv_head, n_embd=32, n_head=4, block_size=16):",
    )
    path = _file(tmp_path, "gqa", text)
    with pytest.raises(UserValueError, match=r"this builds it: --arg n_kv_head=2$"):
        check_block(f"{path}:Block", isolate=False)
    assert check_block(f"{path}:Block", isolate=False, n_kv_head=2).diagnosis == ["gqa_order"]


def test_a_block_ungrouped_at_its_files_sizes_is_checked_grouped_at_others(tmp_path):
    # n_kv_head = n_head by default: keys tiled in the wrong order compute the right block there
    # (one key/value head each); the other sizes group them, and the tiling shows
    text = (Path(__file__).parent / "zoo_modern" / "blocks" / "gqa_lesson.py").read_text()
    text = text.replace("n_head=4, n_kv_head=2,", "n_head=4, n_kv_head=4,")
    right = check_block(f"{_file(tmp_path, 'right', text)}:Block", isolate=False)
    assert right.passed and "n_head=6, n_kv_head=3," in " ".join(right.notes), str(right)
    text = text.replace("k = k.repeat_interleave(group, dim=1)", "k = k.repeat(1, group, 1, 1)")
    text = text.replace("v = v.repeat_interleave(group, dim=1)", "v = v.repeat(1, group, 1, 1)")
    tiled = check_block(f"{_file(tmp_path, 'tiled', text)}:Block", isolate=False)
    assert not tiled.passed and tiled.diagnosis == ["gqa_order"], str(tiled)


def test_a_mask_made_in_forward_is_compared_up_to_the_files_block_size(tmp_path):
    # (s22 unseen set) no buffer and no argument says how long its sequences are, but the file's
    # block_size = 32 does: a window of 21 positions (right up to T = 21) passed at T <= 16
    text = LECTURE.replace(
        "self.register_buffer('tril', torch.tril(torch.ones(block_size, block_size)))", "pass"
    ).replace(
        "wei = wei.masked_fill(self.tril[:T, :T] == 0, float('-inf'))",
        "i = torch.arange(T)\n"
        "        far = (i[:, None] < i[None, :]) | (i[:, None] - i[None, :] > 20)\n"
        "        wei = wei.masked_fill(far, float('-inf'))",
    )
    report = check_block(f"{_file(tmp_path, 'window', text)}:Block", isolate=False)
    said = {f.name: f.message for f in report.findings}["reference comparison"]
    assert not report.passed and said.startswith("equal for T <= 21, off by"), str(report)


def test_a_plain_config_class_gives_its_values_as_defaults(tmp_path):
    # (s22 unseen set) ``class Config: n_embd = 48`` (no dataclass): its values are the file's
    # sizes, and the block is built from them (before: --arg asked for each, head_dim at the width)
    plain = NANOGPT.replace("@dataclass\nclass GPTConfig:", "class GPTConfig:").replace(
        ": int = ", " = "
    ).replace(": float = ", " = ").replace(": bool = ", " = ")  # fmt: skip
    report = check_block(f"{_file(tmp_path, 'plain', plain)}:Block", isolate=False)
    said = " ".join(report.notes)
    assert report.passed and "n_embd=48, n_head=6, block_size=64 from the config's defaults" in said
    assert "checked again at n_embd=" in said and ": PASS" in said, str(report)


def test_a_dataclass_without_fields_gives_its_class_values_as_defaults(tmp_path):
    # (s84 unseen set) ``@dataclass class Config: n_embd = 48`` has no fields (no annotations):
    # its values are read as a plain class's (before: refused, "its config needs n_embd")
    plain = (
        NANOGPT.replace(": int = ", " = ").replace(": float = ", " = ").replace(": bool = ", " = ")
    )
    report = check_block(f"{_file(tmp_path, 'fieldless', plain)}:Block", isolate=False)
    said = " ".join(report.notes)
    assert report.passed and "n_embd=48, n_head=6, block_size=64 from the config's defaults" in said


def test_a_size_error_in_forward_names_the_learners_line_through_the_command(tmp_path):
    # (s22 unseen set) the shape mistake's evidence says where: a mask expanded to the wrong size
    text = LECTURE.replace(
        "wei = wei.masked_fill(self.tril[:T, :T] == 0, float('-inf'))",
        "wei = wei.masked_fill(self.tril[:T, :T].expand(B, 1, 1) == 0, float('-inf'))",
    )
    report = check_block(f"{_file(tmp_path, 'expand', text)}:Block", isolate=True)
    said = report.findings[0].message
    assert report.diagnosis == ["shape"] and "expand.py:" in said, str(report)
    assert said.endswith(
        ": wei = wei.masked_fill(self.tril[:T, :T].expand(B, 1, 1) == 0, float('-inf')))"
    )


def test_a_dataclass_configs_own_bias_default_builds_the_block(tmp_path):
    # (s22 note) a dataclass's ``bias: bool = False`` was built as the checker's common True: a
    # parameter made only with biases then never acted (FAIL unused_parameters on a right block)
    text = NANOGPT.replace("bias: bool = True", "bias: bool = False").replace(
        "self.mlp = MLP(config)\n",
        "self.mlp = MLP(config)\n        if config.bias:\n"
        "            self.gain = nn.Parameter(torch.ones(config.n_embd))  # never used\n",
    )
    report = check_block(f"{_file(tmp_path, 'nobias', text)}:Block", isolate=False)
    assert report.passed, str(report)
    given = check_block(f"{_file(tmp_path, 'bias', text)}:Block", isolate=False, bias=True)
    assert given.diagnosis == ["unused_parameters"] and "gain" in str(given), str(given)


# the rest of the lecture's gpt.py as it stands: it reads its data and trains when imported
SCRIPT = """
import wandb_not_installed  # what the block does not use need not be there
with open("input.txt") as f:  # no such file here
    text = f.read()
chars = sorted(set(text))
model = BigramLanguageModel(len(chars))
while True:  # the training run, never to end
    model.step()
"""


def test_a_file_that_trains_when_imported_runs_only_what_the_block_needs(tmp_path):
    first = LECTURE.count("\n") + 2  # SCRIPT's first line in the file
    path = _file(tmp_path, "gpt", LECTURE + SCRIPT)
    done = _cli(f"{path}:Block", "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert f"not run: gpt.py's top-level lines {first}-{first + 6} (nothing the block" in said


def test_a_setting_set_again_from_the_training_text_does_not_run(tmp_path):
    # (s76 unseen set: a Colab copy of the lecture) ``vocab_size = len(chars)`` after the setting
    # ``vocab_size = 65`` was kept without ``chars``; the part failed, the whole file ran, and its
    # input.txt is not here: the block was refused
    again = SCRIPT.replace("model = ", "vocab_size = len(chars)\nmodel = ")
    path = _file(tmp_path, "gpt", LECTURE + "vocab_size = 65\n" + again)
    report = check_block(f"{path}:Block", isolate=False)
    assert report.passed and "not run: gpt.py's top-level lines" in " ".join(report.notes)


def test_a_module_parsing_the_command_line_when_imported_is_loaded(tmp_path):
    # (s81 unseen set) the block's sizes from a module calling parse_args() at import: the child
    # still had the supervisor's arguments, argparse exited 2, and the block was refused
    (tmp_path / "settings.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--n_embd', type=int, default=32)\nargs = parser.parse_args()\n"
    )
    text = LECTURE.replace("n_embd = 64\n", "from settings import args\nn_embd = args.n_embd\n")
    report = check_block(f"{_file(tmp_path, 'gpt', text)}:Block")
    assert report.passed and "n_embd=32" in " ".join(report.notes), str(report)


def test_a_module_in_a_folder_above_the_file_is_said_where(tmp_path):
    # (s81 unseen set) models/model.py importing the project root's config.py, as its root's
    # scripts run it: the refusal says which folder holds it
    (tmp_path / "config.py").write_text("n_embd = 32\n")
    (tmp_path / "models").mkdir()
    path = _file(tmp_path / "models", "model", "from config import n_embd\n" + LECTURE)
    with pytest.raises(UserValueError, match=f"config is in {tmp_path}: PYTHONPATH={tmp_path}"):
        check_block(f"{path}:Block", isolate=False)


def test_what_binds_or_changes_what_the_block_reads_still_runs(tmp_path):
    # a top-level patch of a class the block uses, a setting changed by a call, and a size read
    # from a function's global: each runs (the last, with the whole file)
    patch = textwrap.dedent(
        """
        def unscaled(self, x):
            B, T, C = x.shape
            wei = self.query(x) @ self.key(x).transpose(-2, -1)
            wei = wei.masked_fill(self.tril[:T, :T] == 0, float('-inf'))
            return F.softmax(wei, dim=-1) @ self.value(x)

        Head.forward = unscaled
        while True:
            pass
        """
    )
    report = check_block(f"{_file(tmp_path, 'patched', LECTURE + patch)}:Block")
    assert report.diagnosis == ["no_scaling"], str(report)
    text = LECTURE.replace(
        "dropout = 0.0", "options = {}\noptions.update(p=0.0)\ndropout = options['p']"
    )
    grown = Path(_file(tmp_path, "grown", text + SCRIPT))
    assert definitions(grown, "Block") is not None  # the update runs, the loop does not
    not_run = [range(int(a), int(b or a) + 1) for a, _, b in (
        span.partition("-") for span in SKIPPED[str(grown.absolute())][6:].split(", "))]  # fmt: skip
    lines = grown.read_text().splitlines()
    assert not any(lines.index("options.update(p=0.0)") + 1 in span for span in not_run)
    assert any(
        lines.index("while True:  # the training run, never to end") + 1 in s for s in not_run
    )
    held = LECTURE.replace(
        "block_size = 32", "def sizes():\n    global block_size\n    block_size = 32\nsizes()"
    )
    assert definitions(Path(_file(tmp_path, "held", held + SCRIPT)), "Block") is None


def test_a_file_whose_needed_part_fails_alone_runs_whole(tmp_path):
    # the part left out set the path an import needs: the whole file runs, as it stands
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "lib_sizes.py").write_text("BLOCK = 32\n")
    head = "import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'lib'))\n"
    text = (
        head
        + "from lib_sizes import BLOCK\n"
        + LECTURE.replace("block_size = 32", "block_size = BLOCK")
    )
    report = check_block(f"{_file(tmp_path, 'gpt', text)}:Block")
    assert report.passed and "not run" not in " ".join(report.notes), str(report)


def test_what_was_left_out_is_said_of_the_last_load_only(tmp_path):
    path = Path(_file(tmp_path, "gpt", LECTURE + SCRIPT))
    assert definitions(path, "Block") is not None and str(path.absolute()) in SKIPPED
    assert definitions(path, "model") is None  # the script itself: every statement runs
    assert str(path.absolute()) not in SKIPPED


def test_a_notebook_is_checked_as_its_code_cells(tmp_path):
    # magics and a shell line, a markdown cell, the block (its scale wrong) and a print after
    # it, then a cell that trains: the print and the training do not run
    block = LECTURE.replace("k.shape[-1]**-0.5", "C**-0.5") + "print(Block)\n"
    cells = [["%matplotlib inline\n", "!pip install torch\n"], None, block, SCRIPT]
    path = tmp_path / "gpt.ipynb"
    path.write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": c} if c else {"cell_type": "markdown", "source": "# x"}
        for c in cells
    ]}))  # fmt: skip
    done = _cli(f"{path}:Block", "--timeout", "60")
    assert done.returncode == 1 and "wrong_scale" in done.stdout, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "not run: gpt.ipynb's top-level cells 3 in part, 4 (nothing the block" in said
    assert "result: FAIL (1 mistake found by the comparison; the other 7 checks passed)" in said
    path.write_text(path.read_text().replace("self.key(x)", "self.kee(x)"))
    with pytest.raises(UserValueError, match=r"'kee' \(at .*gpt.ipynb, cell 3: k = self.kee\(x"):
        check_block(f"{path}:Block", isolate=False)  # the cell's line, not the file's JSON
    path.write_text(path.read_text().replace("import wandb_not_installed", "from grader import *"))
    with pytest.raises(UserValueError, match=r"'grader' \(at .*gpt.ipynb, cell 4: from grader"):
        check_block(f"{path}:Block", isolate=False)  # a star import runs: where it failed
    broken = json.loads(path.read_text())
    broken["cells"].append({"cell_type": "code", "source": "y = 1\nprint(y\n"})
    path.write_text(json.dumps(broken))
    with pytest.raises(UserValueError, match=r"never closed \(gpt.ipynb, cell 5, line 2\)"):
        check_block(f"{path}:Block", isolate=False)  # the cell's line, not the joined cells' (s93)
    path.write_text("{")
    done = _cli(f"{path}:Block")
    assert done.returncode == 2 and "gpt.ipynb: not a notebook" in done.stderr, done.stderr


def test_the_part_that_runs_is_compiled_without_the_checkers_future_imports(tmp_path):
    text = LECTURE.replace(
        "def __init__(self, n_embd, n_head)", "def __init__(self, n_embd: int, n_head)"
    )
    code = definitions(Path(_file(tmp_path, "gpt", text + SCRIPT)), "Block")
    scope: dict[str, object] = {}
    exec(code, scope)
    assert scope["Block"].__init__.__annotations__ == {"n_embd": int}  # not the text "int"


def test_a_postponed_annotation_is_not_read_as_a_name_the_block_needs(tmp_path):
    # ``List`` is never imported: under the file's ``from __future__ import annotations`` that is
    # no error, and no reason to run the training around it; in a notebook the import may come
    # after a cell of shell lines, where a file could not have it
    helper = "\ndef encode(s: str) -> List[int]:\n    return [ord(c) for c in s]\n"
    text = "from __future__ import annotations\n" + LECTURE + helper + SCRIPT
    assert definitions(Path(_file(tmp_path, "gpt", text)), "Block") is not None
    cells = [["!pip install torch\n"], text]
    path = tmp_path / "gpt.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells]}))
    report = check_block(f"{path}:Block", isolate=False)
    assert report.passed and "cells 2 in part" in " ".join(report.notes), str(report)


def test_a_file_in_a_package_imports_the_package_relatively_and_by_name(tmp_path):
    # mygpt/model.py: ``from .layers import ...`` and ``from mygpt.layers import ...``, its
    # package's __init__.py importing it back; checked from the project's root as a file and
    # as a module, and from elsewhere as a file
    (tmp_path / "mygpt").mkdir()
    (tmp_path / "mygpt" / "__init__.py").write_text("from .model import Block\n")
    at = LECTURE.index("class Block")
    (tmp_path / "mygpt" / "layers.py").write_text(LECTURE[:at])
    imports = "from .layers import *\nfrom mygpt.layers import MultiHeadAttention\n"
    (tmp_path / "mygpt" / "model.py").write_text(LECTURE[:at] + imports + LECTURE[at:])
    for target, cwd in (("mygpt/model.py", tmp_path), ("mygpt.model", tmp_path)):
        done = _cli(f"{target}:Block", cwd=cwd)
        assert done.returncode == 0, done.stdout + done.stderr
    report = check_block(f"{tmp_path / 'mygpt' / 'model.py'}:Block", isolate=False)
    assert report.passed, str(report)
    # a file named as its package (model/model.py) importing ``model.layers``: the package
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "__init__.py").write_text("")
    (tmp_path / "model" / "layers.py").write_text(LECTURE[:at])
    text = LECTURE[:at] + "from model.layers import *\n" + LECTURE[at:]
    (tmp_path / "model" / "model.py").write_text(text)
    assert check_block(f"{tmp_path / 'model' / 'model.py'}:Block", isolate=False).passed
    (tmp_path / "mygpt" / "__init__.py").unlink()  # a namespace package: relative imports still
    text = LECTURE[:at] + "from .layers import *\n" + LECTURE[at:]
    (tmp_path / "mygpt" / "model.py").write_text(text)
    assert check_block(f"{tmp_path / 'mygpt' / 'model.py'}:Block", isolate=False).passed


def test_a_config_field_the_block_reads_and_its_dataclass_lacks_is_said(tmp_path):
    text = NANOGPT.replace("config.n_head", "config.n_heads", 1)
    with pytest.raises(
        UserValueError, match=r"it reads config.n_heads, which its GPTConfig has no field for \(at "
    ):
        check_block(f"{_file(tmp_path, 'fields', text)}:Block", isolate=False)


RASCHKA = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    GPT_CONFIG_124M = {"vocab_size": 50257, "context_length": 1024, "emb_dim": 768,
                       "n_heads": 12, "n_layers": 12, "drop_rate": 0.1, "qkv_bias": False}


    class TransformerBlock(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            d, L = cfg["emb_dim"], cfg["context_length"]
            self.heads, self.drop = cfg["n_heads"], nn.Dropout(cfg["drop_rate"])
            self.qkv = nn.Linear(d, 3 * d, bias=cfg["qkv_bias"])
            self.out_proj = nn.Linear(d, d)
            self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.register_buffer("mask", torch.triu(torch.ones(L, L), diagonal=1).bool())

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            s = (q @ k.transpose(-2, -1)).masked_fill(self.mask[:t, :t], -torch.inf)
            w = self.drop(torch.softmax(s / k.shape[-1] ** 0.5, dim=-1))
            x = x + self.drop(self.out_proj((w @ v).transpose(1, 2).reshape(b, t, d)))
            return x + self.drop(self.ff(self.norm2(x)))


    model = TransformerBlock(GPT_CONFIG_124M)
    """
)


def test_a_config_the_file_builds_the_block_with_gives_its_values_and_sizes(tmp_path):
    # ``TransformerBlock(cfg)`` and the file's ``GPT_CONFIG_124M`` (LLMs-from-scratch): built
    # from that dict at its sizes (made smaller), its own keys and values, nothing asked for
    report = check_block(f"{_file(tmp_path, 'ch04', RASCHKA)}:TransformerBlock", isolate=False)
    assert report.passed, str(report)
    assert report.target.startswith("TransformerBlock(cfg={'vocab_size': 50257, 'context_length'")
    assert (
        "'emb_dim': 192, 'n_heads': 12, 'n_layers': 12, 'drop_rate': 0.1, 'qkv_bias': False}"
        in report.target
    )
    assert "emb_dim=768, n_heads=12, context_length=1024 from ch04.py's module" in " ".join(
        report.notes
    )


def test_a_flag_left_at_its_default_is_named_with_the_diagnosis_it_chose():
    """(s56 public set, DETR) ``normalize_before=False`` by default builds a post-norm layer: the
    report says which default built what it diagnosed, and the flag given builds the other."""
    import torch.nn as nn

    class Layer(nn.Module):
        def __init__(self, d_model, nhead, normalize_before=False):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(
                d_model, nhead, 4 * d_model, 0.0, batch_first=True, norm_first=normalize_before
            )

        def forward(self, x):
            return self.layer(x, src_mask=nn.Transformer.generate_square_subsequent_mask(
                x.shape[1]), is_causal=True)  # fmt: skip

    report = check_block(Layer, d_model=16, nhead=2, isolate=False)
    assert report.diagnosis == ["post_norm"]
    assert "built with its flags' defaults: normalize_before=False" in report.notes
    again = check_block(Layer, d_model=16, nhead=2, normalize_before=True, isolate=False)
    assert again.passed and not any("flags' defaults" in n for n in again.notes)


def test_a_config_parameter_named_with_a_config_word_is_built_as_one(tmp_path):
    # (s70 unseen set) ``Block(gpt_params)``, the file's own zero-argument class: refused, "it
    # needs gpt_params, which --arg does not give"; the same block taking ``config`` passed
    i = NANOGPT.index("class Block")
    block = NANOGPT[i:].replace("config: GPTConfig", "gpt_params", 1)
    block = block.replace("(config.", "(gpt_params.").replace("(config,", "(gpt_params,")
    block = block.replace("MLP(config)", "MLP(gpt_params)").replace(
        "config.bias", "gpt_params.bias"
    )
    assert "config" not in block.split("def forward")[0], block
    report = check_block(f"{_file(tmp_path, 'params', NANOGPT[:i] + block)}:Block", isolate=False)
    assert report.passed and "gpt_params=GPTConfig(" in report.target, str(report)


def test_sizes_the_file_chose_that_do_not_divide_run_and_fail_at_its_line(tmp_path):
    # (s70 unseen set) n_embd = 64, n_head = 6 in the file: refused as "the checker's default";
    # the file's own sizes build: the lecture's proj(head_size * num_heads -> n_embd) runs, and
    # a proj(n_embd -> n_embd) fails at the learner's line (60 != 64)
    text = LECTURE.replace("n_head = 4", "n_head = 6")
    assert check_block(f"{_file(tmp_path, 'gpt6', text)}:Block", isolate=False).passed
    text = text.replace("nn.Linear(head_size * num_heads, n_embd)", "nn.Linear(n_embd, n_embd)")
    report = check_block(f"{_file(tmp_path, 'gpt6', text)}:Block", isolate=False)
    said = {f.name: f.message for f in report.findings}.get("shape", "")
    assert report.diagnosis == ["shape"] and "(36x60 and 64x64)" in said, str(report)
    # sizes the checker chose still get the refusal, naming whose they are
    with pytest.raises(UserValueError, match=r"n_head=6 \(the file's; --arg n_head=N changes it\)"):
        check_block(f"{_file(tmp_path, 'gpt7', text)}:Block", isolate=False, n_embd=64 + 1)


PRETRAINED = """
import torch.nn as nn
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny"

    def __init__(self, n_embd=32, n_head=4, **kwargs):
        super().__init__(**kwargs)
        self.n_embd, self.n_head = n_embd, n_head


class Block(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(
            config.n_embd, config.n_head, 4 * config.n_embd, 0.0, batch_first=True, norm_first=True
        )

    def forward(self, x):
        T = x.shape[1]
        return self.block(x, nn.Transformer.generate_square_subsequent_mask(T), is_causal=True)
"""


def test_a_pretrained_config_subclass_is_built_by_its_own_init_and_sent_to_the_runner(tmp_path):
    # (s71 unseen set: MiniMind) transformers 5's PretrainedConfig is a dataclass: its subclass
    # was built from the base's fields ("has no field dropout"), and its int-keyed id2label could
    # not be sent to the runner's process
    pytest.importorskip("transformers")
    report = check_block(f"{_file(tmp_path, 'tiny', PRETRAINED)}:Block", n_embd=48, n_head=4)
    assert report.passed and '"n_embd": 48' in report.target, str(report)
