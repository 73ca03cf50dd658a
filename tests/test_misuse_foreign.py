"""Misuse, issue 21 class 4: other tools' files never crash gptblock.

A Hugging Face directory, a nanoGPT checkpoint and gptblock's own checkpoint (forged, hashes
recomputed) are each broken one way at a time: missing, truncated, random bytes, malformed JSON,
a field of the wrong type, a weight of the wrong shape, a model too big for any machine. Each is
refused with one line naming the file (and the field, where there is one), the bytes of every
file compared before and after. Cases that would allocate terabytes if a check regressed run under a memory limit
(``in_a_subprocess``: in this process, its address-space limit lowered for the call), so a
regression fails the test instead of the machine.
"""

import contextlib
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from forge import edit_json, edit_tensors, read_json
from gptblock import GPT, GPTConfig, load_gpt, train_gpt
from gptblock.cli import main
from gptblock.data.bpe import BPETokenizer
from gptblock.data.text import default_corpus
from gptblock.errors import UserError
from gptblock.interop.hf import from_hf, save_hf
from gptblock.interop.nanogpt import from_nanogpt
from gptblock.runs.meta import FORMAT_1_MODEL_FIELDS

SRC = Path(__file__).resolve().parents[1] / "src"
TEXT = default_corpus()[:3000]
MEMORY_LIMIT = 8 * 2**30
TIMEOUT = 120


def snapshot(directory):
    return {str(p): p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def one_line(err, command, *needles):
    lines = [ln for ln in err.splitlines() if ": warning: " not in ln]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"gptblock {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def in_a_subprocess(*args):
    """``gptblock ARGS`` with at most ``MEMORY_LIMIT`` of address space beyond what this process
    holds now: in this process (``memory_limited``; no torch import each), its thread count put
    back after. Where the address space cannot be read, a limited subprocess."""
    if address_space() is None:
        return _limited_subprocess(*args)
    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with memory_limited(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's own refusals
                code = e.code
    finally:
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def memory_limited():
    """At most ``MEMORY_LIMIT`` of address space beyond what this process holds now, while the
    block runs: a soft limit lowered, then put back, so an allocation past it fails at once, as
    in a limited subprocess."""
    held = address_space()
    if held is None:
        pytest.skip("no /proc/self/status to read this process's address space from")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = held + MEMORY_LIMIT
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def address_space():
    """This process's mapped address space in bytes (Linux's VmSize), or None."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmSize:\s+(\d+) kB", status, re.M)
    return int(found.group(1)) * 1024 if found else None


def _limited_subprocess(*args):
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "gptblock", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=limit,
    )


# --- Hugging Face directories -------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    save_hf(GPT(GPTConfig(300, 16, n_layer=2, n_head=2, n_embd=8)), directory)
    BPETokenizer.train(TEXT, 300).tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture
def hf(hf_saved, tmp_path):
    copy = tmp_path / "hf"
    shutil.copytree(hf_saved, copy)
    return copy


def config_field(name, value):
    def change(d):
        fields = json.loads((d / "config.json").read_text())
        fields[name] = value
        (d / "config.json").write_text(json.dumps(fields))

    return change


def rewrite_weights(change):
    def apply(d):
        tensors = safetensors.torch.load((d / "model.safetensors").read_bytes())
        change(tensors)
        (d / "model.safetensors").write_bytes(safetensors.torch.save(tensors))

    return apply


def sharded(index):
    def apply(d):
        (d / "model.safetensors.index.json").write_text(index)

    return apply


def truncate(name, keep):
    def apply(d):
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: keep if keep >= 0 else len(data) + keep])

    return apply


def random_bytes(name, n=4096):
    def apply(d):
        (d / name).write_bytes(os.urandom(n))

    return apply


HF_CASES = {  # how the directory is broken -> what the one line names
    "no config.json": (lambda d: (d / "config.json").unlink(), ["no config.json in"]),
    "config.json not JSON": (
        lambda d: (d / "config.json").write_text("{'n_embd': 8"),
        ["config.json: not valid JSON"],
    ),
    "config.json a list": (
        lambda d: (d / "config.json").write_text("[1, 2]"),
        ["config.json: expected a JSON object, got list"],
    ),
    "config.json random bytes": (random_bytes("config.json"), ["config.json: not valid JSON"]),
    "n_embd a string": (config_field("n_embd", "8"), ["config.json: field n_embd", "'8'"]),
    "n_layer 0": (config_field("n_layer", 0), ["config.json: field n_layer", "0"]),
    "n_head -2": (config_field("n_head", -2), ["config.json: field n_head", "-2"]),
    "n_head 3": (config_field("n_head", 3), ["config.json", "n_embd=8 is not divisible"]),
    "vocab_size true": (config_field("vocab_size", True), ["config.json: field vocab_size"]),
    "model_type llama": (config_field("model_type", "llama"), ["config.json", "model_type"]),
    "n_inner 7": (config_field("n_inner", 7), ["config.json", "n_inner=7"]),
    "safetensors truncated": (
        truncate("model.safetensors", -100),
        ["model.safetensors: not a readable safetensors file"],
    ),
    "safetensors header only": (
        truncate("model.safetensors", 20),
        ["model.safetensors: not a readable safetensors file"],
    ),
    "safetensors empty": (
        truncate("model.safetensors", 0),
        ["model.safetensors: not a readable safetensors file"],
    ),
    "safetensors random": (
        random_bytes("model.safetensors"),
        ["model.safetensors: not a readable safetensors file"],
    ),
    "weight of another shape": (
        rewrite_weights(
            lambda t: t.__setitem__("transformer.h.1.mlp.c_fc.weight", torch.zeros(8, 31))
        ),
        ["model.safetensors: transformer.h.1.mlp.c_fc.weight has shape (8, 31)", "(8, 32)"],
    ),
    "embedding of another shape": (
        rewrite_weights(lambda t: t.__setitem__("transformer.wte.weight", torch.zeros(299, 8))),
        ["transformer.wte.weight has shape (299, 8)", "(300, 8)"],
    ),
    "a weight missing": (
        rewrite_weights(lambda t: t.pop("transformer.h.1.ln_2.bias")),
        ["h.1.ln_2.bias"],
    ),
    "index not JSON": (sharded("{"), ["model.safetensors.index.json: not a JSON object"]),
    "index without weight_map": (
        sharded('{"metadata": {}}'),
        ["model.safetensors.index.json: field weight_map"],
    ),
    "index naming a path elsewhere": (
        sharded('{"weight_map": {"wte.weight": "../../etc/passwd"}}'),
        ["model.safetensors.index.json: field weight_map names '../../etc/passwd'"],
    ),
    "index naming a missing shard": (
        sharded('{"weight_map": {"wte.weight": "shard-2.safetensors"}}'),
        ["weight_map names shard-2.safetensors, which is missing"],
    ),
    "tokenizer.json not JSON": (
        lambda d: (d / "tokenizer.json").write_text('{"model": '),
        ["tokenizer.json: not a readable tokenizer"],
    ),
    "tokenizer.json random bytes": (
        random_bytes("tokenizer.json"),
        ["tokenizer.json: not a readable tokenizer"],
    ),
    "tokenizer.json of another kind": (
        lambda d: (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "X"}}'),
        ["tokenizer.json: not a readable tokenizer"],
    ),
    "no weights at all": (
        lambda d: (d / "model.safetensors").unlink(),
        ["no model.safetensors in"],
    ),
}


@pytest.mark.parametrize("command", ["sample", "inspect"])
@pytest.mark.parametrize("damage, names", HF_CASES.values(), ids=HF_CASES.keys())
def test_a_broken_hugging_face_directory_is_one_line(hf, capsys, damage, names, command):
    damage(hf)
    before = snapshot(hf)
    args = ["--hf", str(hf), "--prompt", "The", "--threads", "1"]
    assert main([command, *args]) == 2
    one_line(capsys.readouterr().err, command, *names)
    assert snapshot(hf) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "field, value",
    [("vocab_size", 10**9), ("n_embd", 2**20), ("n_layer", 10**7), ("n_positions", 10**12)],
)
def test_a_hugging_face_config_too_big_is_refused_before_allocating(hf, field, value):
    config_field(field, value)(hf)
    if field == "n_embd":
        config_field("n_head", 1)(hf)
    before = snapshot(hf)
    r = in_a_subprocess("sample", "--hf", str(hf), "--threads", "1")
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, "sample", "config.json: a model of", "available")
    assert snapshot(hf) == before


def test_from_hf_names_the_missing_config_rather_than_guessing_gpt2(hf):
    (hf / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no config\.json in"):
        from_hf(hf)


# --- nanoGPT checkpoints ------------------------------------------------------------------------


def nanogpt_ckpt(path, **changes):
    torch.manual_seed(0)
    model = GPT(GPTConfig(11, 8, n_layer=1, n_head=2, n_embd=8, activation="gelu"))
    state = {}
    for k, v in model.state_dict().items():  # gptblock's names -> nanoGPT's (both nn.Linear)
        k = k.replace("norm1", "ln_1").replace("norm2", "ln_2")
        k = k.replace("self_attn.in_proj_weight", "attn.c_attn.weight")
        k = k.replace("self_attn.in_proj_bias", "attn.c_attn.bias")
        k = k.replace("self_attn.out_proj", "attn.c_proj")
        k = k.replace("linear1", "mlp.c_fc").replace("linear2", "mlp.c_proj")
        state[k] = v
    args = dict(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, bias=True)
    ckpt = {"model": state, "model_args": args}
    for key, value in changes.items():
        if key in args:
            args[key] = value
        else:
            ckpt[key] = value
    torch.save(ckpt, path)
    return path


def test_the_nanogpt_stand_in_loads(tmp_path):
    model, _ = from_nanogpt(nanogpt_ckpt(tmp_path / "ckpt.pt"))
    assert model.config.n_layer == 1  # the broken cases below differ from this by one thing


NANOGPT_CASES = {
    "a text file": (lambda p: p.write_text("hello world\n" * 20), "not a readable PyTorch"),
    "random bytes": (lambda p: p.write_bytes(os.urandom(5000)), "ckpt.pt: "),  # either refusal
    "empty": (lambda p: p.write_bytes(b""), "not a readable PyTorch"),
    "truncated": (
        lambda p: p.write_bytes(nanogpt_ckpt(p).read_bytes()[:300]),
        "not a readable PyTorch",
    ),
    "model_args a list": (lambda p: nanogpt_ckpt(p, model_args=[1, 2]), "must be dicts"),
    "n_layer a string": (lambda p: nanogpt_ckpt(p, n_layer="1"), "model_args n_layer"),
    "n_embd 0": (lambda p: nanogpt_ckpt(p, n_embd=0), "model_args n_embd"),
    "n_head 3": (lambda p: nanogpt_ckpt(p, n_head=3), "n_embd=8 is not divisible"),
    "vocab 12 for 11 rows": (
        lambda p: nanogpt_ckpt(p, vocab_size=12),
        "transformer.wte.weight has shape (11, 8), but model_args need (12, 8)",
    ),
    "model holding a string": (lambda p: nanogpt_ckpt(p, model={"a": "b"}), "map names"),
    "a block missing": (lambda p: nanogpt_ckpt(p, n_layer=2), "the weights have no"),
}


@pytest.mark.parametrize("damage, message", NANOGPT_CASES.values(), ids=NANOGPT_CASES.keys())
def test_a_broken_nanogpt_checkpoint_is_refused_naming_the_file(tmp_path, damage, message):
    path = tmp_path / "ckpt.pt"
    damage(path)
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match=re.escape(message)) as caught:
        from_nanogpt(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_nanogpt_checkpoint_too_big_is_refused_before_allocating(tmp_path):
    path = nanogpt_ckpt(tmp_path / "ckpt.pt", n_embd=10**6, n_head=1)
    with memory_limited(), pytest.raises(ValueError) as refused:
        from_nanogpt(path)
    assert "ckpt.pt: a model of" in str(refused.value) and "available" in str(refused.value)


# --- gptblock's own checkpoints, forged ---------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    train_gpt(
        text=TEXT, out_dir=out, seed=1, n_layer=1, n_head=2, n_embd=16, block_size=16,
        batch_size=4, max_iters=2, eval_interval=2, eval_iters=1, warmup=1, progress=False,
    )  # fmt: skip
    return out


@pytest.fixture
def run(saved_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(saved_run, copy)
    return copy


@pytest.mark.slow
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("n_embd", 1_000_000, "does not fit model.transformer.wte.weight"),
        ("n_layer", 200_000, "n_layer=200000, but"),
        ("block_size", 10**9, "does not fit model.transformer.wpe.weight"),
        ("vocab_size", 10**9, "model_config"),
    ],
)
def test_a_rehashed_checkpoint_of_an_absurd_model_is_refused_before_building(
    run, field, value, message
):
    edit_json(run, lambda m: m["model_config"].__setitem__(field, value), kind="best")
    before = snapshot(run)
    r = in_a_subprocess("sample", "--out", str(run), "--threads", "1")
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(r.stderr, "sample", "best.json", message)
    assert snapshot(run) == before


def test_a_rehashed_checkpoint_with_one_block_too_few_is_refused(run):
    edit_tensors(
        run,
        lambda t: [t.pop(k) for k in list(t) if k.startswith("model.transformer.h.0.")],
        kind="best",
    )
    with pytest.raises(UserError, match=r"holds the weights of 0 block\(s\)"):
        load_gpt(run)


def v1(run, change):
    """The run's best checkpoint rewritten as format 1 (no JSON hash), ``change`` applied."""
    meta = read_json(run, "best")
    meta["version"] = 1
    for key in ("json_sha256", "tied"):
        meta.pop(key, None)
    # Only the fields format 1 had (later ones: norm_eps, tie_embeddings, issue 20's options).
    meta["model_config"] = {
        k: v for k, v in meta["model_config"].items() if k in FORMAT_1_MODEL_FIELDS
    }
    change(meta)
    (run / "best.json").write_text(json.dumps(meta))


def untie(run):
    # Format 1 stored the head beside the embedding: put it back, as 0.2 wrote it.
    meta = read_json(run, "best")
    path = run / meta["tensors"]
    tensors = safetensors.torch.load(path.read_bytes())
    tensors["model.lm_head.weight"] = tensors["model.transformer.wte.weight"].clone()
    blob = safetensors.torch.save(tensors)
    path.write_bytes(blob)
    import hashlib

    meta["sha256"] = hashlib.sha256(blob).hexdigest()
    meta.pop("tied", None)
    (run / "best.json").write_text(json.dumps(meta))


def swap(meta):
    meta["vocab"][3], meta["vocab"][4] = meta["vocab"][4], meta["vocab"][3]


FORMAT_1 = {
    "vocabulary swapped": (swap, "a vocab out of sorted order"),
    "a BPE tokenizer": (lambda m: m.__setitem__("tokenizer", {"kind": "bpe"}), "'tokenizer'"),
    "a later model field": (
        lambda m: m["model_config"].__setitem__("norm_eps", 1e-3),
        "model_config field(s) ['norm_eps']",
    ),
    "a later data field": (lambda m: m["data"].__setitem__("lines", 3), "data field(s)"),
}


@pytest.mark.parametrize("change, message", FORMAT_1.values(), ids=FORMAT_1.keys())
def test_a_format_1_file_holding_what_format_1_could_not_is_refused(run, change, message):
    untie(run)
    v1(run, change)
    with (
        pytest.warns(UserWarning, match="format-1"),
        pytest.raises(UserError, match=re.escape(message)),
    ):
        load_gpt(run)


def test_a_format_1_file_as_format_1_wrote_it_still_loads(run):
    untie(run)
    v1(run, lambda m: None)
    with pytest.warns(UserWarning, match="format-1"):
        model, tok, _ = load_gpt(run)
    assert model.config.vocab_size == tok.vocab_size


# --- absurd sizes the tokenizer library or the data code would choke on -------------------------


def test_bpe_with_a_vocabulary_of_a_billion_learns_what_the_text_has(tmp_path):
    tok = BPETokenizer.train(TEXT[:500], 10**9)  # the library aborted the process on this
    assert 256 < tok.vocab_size <= 256 + len(TEXT[:500].encode())
    assert tok.decode(tok.encode(TEXT[:500])) == TEXT[:500]


@pytest.mark.slow
def test_a_billion_block_size_is_refused_at_once(tmp_path):
    data = tmp_path / "input.txt"
    data.write_text(TEXT)
    r = in_a_subprocess(
        "train", "--data", str(data), "--out", str(tmp_path / "out"), "--block-size",
        "1000000000", "--threads", "1", "--no-progress",
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    one_line(
        r.stderr, "train", "too short for block_size=1000000000", "at least 10000000001 characters"
    )
