"""Misuse, issue 21 classes 5 to 7: valid input accepted, invalid values refused, threads chosen.

Class 5: a model whose embedding is padded beyond its tokenizer (nanoGPT pads GPT-2's 50257 to
50304) samples and inspects over the tokenizer's ids only, even when the padded rows' logits are
the largest; ``save_hf`` onto a file refuses instead of writing nothing. Class 6: values that
were accepted and silently did something else (``cpu:1``, ``bench --quick`` over explicit sizes,
a seed past 2**63, another model's cached run, ``--timeout inf``, every bad argument of
``benchmarks/speedrun.py``) are one line and exit 2. Class 7: ``--threads`` is checked, and the
threads chosen follow the cores other processes leave free.
"""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gptblock import GPT, CharTokenizer, GPTConfig, devices
from gptblock.cli import main
from gptblock.data.bpe import BPETokenizer
from gptblock.data.text import default_corpus
from gptblock.interop.hf import from_hf, save_hf
from gptblock.lens import direct_logit_attribution, inspect_prompt, logit_lens
from gptblock.sampling import sample_text

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "run-v1"
SPEEDRUN = Path(__file__).resolve().parents[1] / "benchmarks" / "speedrun.py"
TEXT = default_corpus()[:3000]


def one_line(err, command, *needles):
    lines = [ln for ln in err.splitlines() if ": warning: " not in ln]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"{command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# --- class 5: a padded vocabulary ---------------------------------------------------------------


def padded_model(V, real):
    """A GPT of ``V`` rows whose padded rows (``real`` and up) win every argmax."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(V, 16, n_layer=1, n_head=2, n_embd=8, tie_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight[real:] = 0
        model.transformer["ln_f"].bias[:] = 1  # the stream's mean: padded logits 0, real ones...
        model.lm_head.weight[:real] = -model.lm_head.weight[:real].abs() - 1  # ... below it
    return model.eval()


@pytest.fixture(scope="module")
def padded_hf(tmp_path_factory):
    directory = tmp_path_factory.mktemp("padded")
    tok = BPETokenizer.train(TEXT, 300)
    save_hf(padded_model(384, tok.vocab_size), directory)
    tok.tokenizer.save(str(directory / "tokenizer.json"))
    return directory, tok.vocab_size


def test_the_padded_rows_would_win_without_the_mask(padded_hf):
    directory, real = padded_hf
    model = from_hf(directory)
    logits = model(torch.tensor([[1, 2, 3]])).logits[0, -1]
    assert int(logits.argmax()) >= real  # so the tests below can fail


@pytest.mark.parametrize("temperature", ["0", "1.0"])
def test_sample_hf_with_a_padded_vocabulary_never_draws_a_padded_id(padded_hf, capsys, temperature):
    directory, _ = padded_hf
    args = ["sample", "--hf", str(directory), "--max-new-tokens", "40", "--prompt", "The "]
    assert main([*args, "--temperature", temperature, "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("The ")


def test_stream_with_vocab_size_draws_below_it_only():
    model = padded_model(16, 11)
    steps = list(model.stream(torch.zeros(1, 1, dtype=torch.long), 30, vocab_size=11))
    assert all(int(s.token) < 11 for s in steps) and steps[0].logits.shape == (1, 11)
    with pytest.raises(ValueError, match=r"vocab_size must be an int in \[1, 16\]"):
        model.stream(torch.zeros(1, 1, dtype=torch.long), 3, vocab_size=17)


def test_sample_text_of_a_nanogpt_style_padded_char_model():
    tok = CharTokenizer.from_text("abcdefghijk")  # 11 characters, 16 rows as nanoGPT pads
    text = sample_text(padded_model(16, 11), tok, "a", max_new_tokens=50, top_k=30)
    assert len(text) == 51 and set(text) <= set("abcdefghijk")


def test_inspect_hf_with_a_padded_vocabulary_reads_the_tokenizers_ids(padded_hf, capsys):
    directory, real = padded_hf
    assert main(["inspect", "--hf", str(directory), "--prompt", "The king", "--threads", "1"]) == 0
    assert "next token  probability" in capsys.readouterr().out
    model, tok = from_hf(directory), BPETokenizer.from_directory(directory)
    seen = inspect_prompt(model, tok, "The king", top_k=400)
    assert len(seen.vocab) == real and len(seen.top) == real
    assert max(i for i, _ in seen.top) < real
    assert abs(sum(p for _, p in seen.top) - 1) < 1e-9  # a distribution over the real ids
    assert seen.lens.probs.shape[-1] == real
    sums = seen.lens.probs.sum(-1)  # (L + 1, T)
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def test_logit_lens_vocab_size_is_checked():
    model = padded_model(16, 11)
    _, cache = model.run_with_cache(torch.tensor([[1, 2]]))
    assert logit_lens(model, cache, vocab_size=11).probs.shape == (2, 2, 11)
    with pytest.raises(ValueError, match="vocab_size must be an int in"):
        logit_lens(model, cache, vocab_size=0)


def test_save_hf_onto_a_file_refuses_and_keeps_it(tmp_path):
    mine = tmp_path / "mine"
    mine.write_bytes(b"mine")
    model = GPT(GPTConfig(11, 8, n_layer=1, n_head=2, n_embd=8))
    with pytest.raises(NotADirectoryError, match="it exists and is not a directory"):
        save_hf(model, mine)
    assert mine.read_bytes() == b"mine" and sorted(os.listdir(tmp_path)) == ["mine"]


# --- class 6: values accepted that should not be ------------------------------------------------


def test_direct_logit_attribution_refuses_another_models_run():
    config = GPTConfig(11, 8, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    a, b = GPT(config).eval(), GPT(config).eval()
    run = a.run_with_cache(torch.tensor([[1, 2, 3]]))
    mine = direct_logit_attribution(a, run, token=4)
    assert abs(float(mine.values.sum()) + mine.bias - mine.logit) < 1e-5
    with pytest.raises(ValueError, match="not this model's own run_with_cache result"):
        direct_logit_attribution(b, run, token=4)
    deeper = GPT(GPTConfig(11, 8, n_layer=2, n_head=2, n_embd=16))
    with pytest.raises(ValueError, match="run has 1 layer"):
        direct_logit_attribution(deeper, run, token=4)


COMMANDS = {  # argv -> what the one line names
    "train cpu:1": (["train", "--device", "cpu:1"], ["device 'cpu:1'", "one cpu device"]),
    "sample cpu:1": (["sample", "--out", str(FIXTURE_RUN), "--device", "cpu:1"], ["'cpu:1'"]),
    "inspect cpu:7": (
        ["inspect", "--out", str(FIXTURE_RUN), "--prompt", "a", "--device", "cpu:7"],
        ["'cpu:7'"],
    ),
    "train threads 0": (["train", "--threads", "0"], ["threads must be a positive int, got 0"]),
    "sample threads -1": (["sample", "--threads", "-1"], ["threads", "-1"]),
    "inspect threads 10**6": (
        ["inspect", "--prompt", "a", "--threads", "1000000"],
        ["threads must be at most"],
    ),
    "train vocab-size 0": (
        ["train", "--tokenizer", "bpe", "--vocab-size", "0", "--threads", "1"],
        ["vocab_size must be a positive int, got 0"],
    ),
    "train vocab-size 255": (
        ["train", "--tokenizer", "bpe", "--vocab-size", "255", "--threads", "1"],
        ["vocab_size must be at least 256"],
    ),
    "bench quick d-model 0": (["bench", "--quick", "--d-model", "0"], ["d_model", "0"]),
    "bench quick heads 0": (["bench", "--quick", "--heads", "0"], ["n_heads", "0"]),
    "bench quick batch 0": (["bench", "--quick", "--batch", "0"], ["batch", "0"]),
    "bench quick d-model 96": (
        ["bench", "--quick", "--d-model", "96", "--heads", "2"],
        ["--quick chooses its own sizes", "--d-model, --heads"],
    ),
    "bench quick repeats 9": (["bench", "--quick", "--repeats", "9"], ["--repeats"]),
    "bench seq-len 0": (["bench", "--seq-len", "0"], ["seq_len", "0"]),
    "bench peak-sizes 0": (["bench", "--peak-sizes", "0"], ["peak", "0"]),
    "exercises seed 2**64": (["exercises", "--seed", str(2**64)], ["--seed", str(2**64)]),
    "exercises seed 2**63": (["exercises", "--seed", str(2**63)], ["--seed", str(2**63)]),
    "check timeout inf": (["check", "--timeout", "inf"], ["--timeout", "inf"]),
    "check timeout 1e12": (["check", "--timeout", "1e12"], ["--timeout", "1000000000000.0"]),
    "check timeout nan": (["check", "--timeout", "nan"], ["--timeout", "nan"]),
    "check timeout 0": (["check", "--timeout", "0"], ["--timeout", "0"]),
}


@pytest.mark.parametrize("argv, names", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_value_that_would_be_misread_is_one_line_and_exit_2(tmp_path, capsys, argv, names):
    if argv[0] == "train":
        data = tmp_path / "input.txt"
        data.write_text(TEXT)
        argv = [*argv, "--data", str(data), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, f"gptblock {argv[0]}", *names)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def speedrun_module():
    # speedrun.py imports its sibling speedrun_budget.py, as it does when run from benchmarks/.
    if str(SPEEDRUN.parent) not in sys.path:
        sys.path.insert(0, str(SPEEDRUN.parent))
    spec = importlib.util.spec_from_file_location("speedrun", SPEEDRUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEEDRUN_ARGS = {
    "threads 0": (["--threads", "0"], ["threads must be a positive int, got 0"]),
    "threads 10**6": (["--threads", "1000000"], ["threads must be at most"]),
    "max_iters -1": (["--set", "max_iters=-1"], ["max_iters", "-1"]),
    "n_layers": (["--set", "n_layers=2"], ["unknown setting 'n_layers'"]),
    "n_embd a word": (["--set", "n_embd=wide"], ["n_embd"]),
    "preset nope": (["--preset", "nope"], ["preset must be one of"]),
    "data /dev/zero": (["--data", "/dev/zero"], ["/dev/zero"]),
    "data missing": (["--data", "/nonexistent/input.txt"], ["/nonexistent/input.txt"]),
    "json unwritable": (["--json", "/nonexistent/run.json"], ["cannot write /nonexistent"]),
    "json a directory": (["--json", "/tmp"], ["cannot write /tmp"]),
    "target inf": (["--target", "inf"], ["--target", "inf"]),
    "target -1": (["--target", "-1"], ["--target", "-1"]),
    "check-at 0": (["--check-at", "0"], ["--check-at", "0"]),
    "seed 2**64": (["--seed", str(2**64)], ["--seed"]),
    # the modern block's settings (issue 20, item 6)
    "norm foo": (["--set", "norm=foo"], ["norm must be one of", "'foo'"]),
    "position spiral": (["--set", "position=spiral"], ["position", "'spiral'"]),
    "n_kv_head 3": (["--set", "n_kv_head=3"], ["n_kv_head=3 does not divide n_head=4"]),
    "n_kv_head 0": (["--set", "n_kv_head=0"], ["n_kv_head", "0"]),
    "rope_theta -1": (["--set", "position=rope", "--set", "rope_theta=-1"], ["rope_theta", "-1"]),
    "rotary_dim odd": (["--set", "position=rope", "--set", "rotary_dim=3"], ["rotary_dim", "3"]),
    "rope_pairing": (["--set", "rope_pairing=spiral"], ["rope_pairing", "'spiral'"]),
    "mlp": (["--set", "mlp=moe"], ["mlp", "'moe'"]),
    "d_ff 0": (["--set", "mlp=swiglu", "--set", "d_ff=0"], ["d_ff", "0"]),
    "qk_norm a word": (["--set", "qk_norm=yes"], ["qk_norm", "'yes'"]),
    "bias a word": (["--set", "bias=maybe"], ["bias must be a bool", "'maybe'"]),
    "tie_embeddings 0": (["--set", "tie_embeddings=0"], ["tie_embeddings", "0"]),
    "activation tanh": (["--set", "activation=tanh"], ["activation", "'tanh'"]),
    "set without =": (["--set", "n_layer"], ["--set expects NAME=VALUE", "'n_layer'"]),
}


@pytest.mark.parametrize("args, names", SPEEDRUN_ARGS.values(), ids=SPEEDRUN_ARGS.keys())
def test_a_bad_speedrun_argument_is_one_line_before_the_run(
    speedrun_module, monkeypatch, capsys, args, names
):
    monkeypatch.setattr(sys, "argv", ["speedrun.py", *args])
    threads = torch.get_num_threads()
    with pytest.raises(SystemExit) as ended:
        speedrun_module.main()
    torch.set_num_threads(threads)
    assert ended.value.code == 2
    one_line(capsys.readouterr().err, "speedrun.py", *names)


# --- class 7: threads ---------------------------------------------------------------------------


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "busy, cpus, expected", [(0.0, 2, 2), (1.0, 2, 1), (1.9, 2, 1), (None, 2, 2)]
)
def test_choose_threads_leaves_the_busy_cores_alone(
    monkeypatch, restore_threads, busy, cpus, expected
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(devices, "busy_cores", lambda seconds=0.1: busy)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    torch.set_num_threads(2)
    assert devices.choose_threads() == expected == torch.get_num_threads()


def test_omp_num_threads_and_an_explicit_count_win(monkeypatch, restore_threads):
    monkeypatch.setattr(devices, "busy_cores", lambda seconds=0.1: 5.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert devices.choose_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert devices.choose_threads(2) == 2 == torch.get_num_threads()


def test_cpu_threads_restores_the_count(monkeypatch, restore_threads):
    torch.set_num_threads(2)
    with devices.cpu_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == 2


def test_busy_cores_sees_a_competing_process():
    quiet = devices.busy_cores(0.3)
    if quiet is None:
        pytest.skip("no /proc/stat")
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy = devices.busy_cores(0.5)
    finally:
        competitor.kill()
        competitor.wait()
    assert busy >= 0.6  # the competitor's core, whatever else the machine is doing


def test_train_says_how_many_threads_it_took(tmp_path, capsys):
    data = tmp_path / "input.txt"
    data.write_text(TEXT)
    argv = ["train", "--data", str(data), "--out", str(tmp_path / "out"), "--no-progress"]
    small = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16"]
    small += ["--batch-size", "4", "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1"]
    threads = torch.get_num_threads()
    assert main([*argv, *small, "--warmup", "1", "--threads", "1"]) == 0
    assert "1 CPU thread)" in capsys.readouterr().out
    assert torch.get_num_threads() == threads  # restored after the command


def test_sample_refuses_top_k_with_greedy_decoding(capsys):
    # --top-k cannot act when --temperature 0 takes the likeliest token: one line, exit 2
    assert main(["sample", "--temperature", "0", "--top-k", "5", "--out", "nowhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "top_k=5 acts only when sampling" in err, err
