"""gptblock bench: the numbers it reports are computed as documented (not how fast they are)."""

import json

import pytest
import torch

from gptblock import FusedBlock, lesson
from gptblock.bench.measure import block_flops, profile_call
from gptblock.bench.report import format_table, write_json
from gptblock.bench.suite import BenchConfig, memory_needed, run_benchmark
from gptblock.cli import main

TINY = BenchConfig(
    d_model=16, n_heads=2, seq_len=8, batch=2, sweep=(4,), warmup=0, repeats=2, peak_sizes=(64,)
)


def test_flops_are_nanogpts_count_with_causal_attention_halved():
    C, T = 384, 256
    N = sum(p.numel() for p in FusedBlock(C, 6).parameters())  # counted, not from the formula
    assert block_flops(C, T, 2048, training=True) == 2048 * (6 * N + 12 * C * T / 2)
    assert block_flops(C, T, 2048, training=False) == 2048 * (2 * N + 4 * C * T / 2)


def test_shapes_keep_tokens_per_call_constant():
    cfg = BenchConfig(sweep=(64, 256, 1024))
    assert cfg.shapes() == [(8, 256), (32, 64), (2, 1024)]


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        BenchConfig(dtype="float8")
    with pytest.raises(ValueError, match="not divisible"):
        BenchConfig(d_model=10, n_heads=3)
    with pytest.raises(ValueError, match="positive int"):
        BenchConfig(sweep=(0,))


def test_run_benchmark_reports_every_form_mode_and_shape_consistently():
    result = run_benchmark(TINY, progress=False)
    rows = result.measurements
    assert len(rows) == 2 * 2 * 5  # shapes x modes x (forms + matmuls alone)
    peak = result.peak.flops_per_s
    assert peak == max(result.peak.by_size.values()) > 0
    for m in rows:
        assert len(m.ms_samples) == TINY.repeats
        assert m.ms == pytest.approx(sum(m.ms_samples) / 2)  # the median of two samples
        assert m.tokens_per_s == pytest.approx(m.batch * m.seq_len / (m.ms / 1e3))
        assert m.pct_of_peak == pytest.approx(100 * m.flops / (m.ms / 1e3) / peak)
        enc = next(
            e
            for e in rows
            if e.form == "encoder_layer" and (e.mode, e.seq_len) == (m.mode, m.seq_len)
        )
        assert m.speedup_vs_encoder_layer == pytest.approx(enc.ms / m.ms)
        assert m.peak_memory_bytes is not None and m.peak_memory_bytes > 0
    # The estimate made before anything is allocated bounds what every call then measured.
    assert max(m.peak_memory_bytes for m in rows) <= memory_needed(TINY)
    fused = [m for m in rows if m.form == "fused"]
    assert all(m.attention.startswith("sdpa") for m in fused)  # never the (T, T) softmax
    table = format_table(result)
    assert {m.attention for m in rows if m.form == "matmuls"} == {"none"}
    for name in ("lesson.Block (ReLU)", "FusedBlock", "matmuls alone (ceiling)", "peak MiB"):
        assert name in table


def peak_memory(module, T, C=128):
    x = torch.randn(1, T, C)
    with torch.no_grad():
        module(x)
        return profile_call(lambda: module(x), torch.device("cpu"))[0]


def test_fused_inference_memory_grows_linearly_in_T_and_the_lessons_does_not():
    # (At small C and T, SDPA's fixed-size scratch blocks, not the activations, would dominate.)
    fused = FusedBlock(128, 2).eval()
    ratio = peak_memory(fused, 2048) / peak_memory(fused, 1024)
    assert 1.9 < ratio < 2.1
    lb = lesson.Block(128, 2, 2048, dropout=0.0).eval()  # one (T, T) matrix per head
    assert peak_memory(lb, 2048) / peak_memory(lb, 1024) > 3


def test_write_json_is_atomic(tmp_path):
    path = tmp_path / "bench.json"
    write_json({"a": 1}, path)
    with pytest.raises(TypeError):
        write_json({("not", "a", "str key"): 1}, path)
    assert json.loads(path.read_text()) == {"a": 1}  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temp file left


def test_cli_quick_run_writes_json(tmp_path, capsys):
    path = tmp_path / "out.json"
    assert main(["bench", "--quick", "--no-progress", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "matmul peak" in out and "FusedBlock" in out
    data = json.loads(path.read_text())
    assert data["config"]["d_model"] == 32 and len(data["measurements"]) == 3 * 2 * 5
    forms = {m["form"] for m in data["measurements"]}
    assert forms == {"lesson", "mha", "fused", "encoder_layer", "matmuls"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the skip on a machine without CUDA")
def test_cli_cuda_without_a_gpu_skips_cleanly(tmp_path, capsys):
    path = tmp_path / "out.json"
    assert main(["bench", "--device", "cuda", "--dtype", "bfloat16", "--json", str(path)]) == 0
    assert "skipped" in capsys.readouterr().err
    assert "CUDA is not available" in json.loads(path.read_text())["skipped"]


def test_cli_help_states_the_flop_formula_and_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "6*N + 6*C*T" in out and "2*N + 2*C*T" in out and "(default: 384)" in out


def test_cli_bad_device_exits_2(capsys):
    assert main(["bench", "--quick", "--device", "tpu"]) == 2
    assert "device must be" in capsys.readouterr().err
