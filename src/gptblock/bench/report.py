"""How ``gptblock bench`` shows what it measured: the table, the FusedBlock summary, the JSON."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from ..files import atomic_write_json
from .suite import MATMULS, MODES, ROWS, BenchResult, Measurement

__all__ = ["format_table", "write_json"]


def format_table(result: BenchResult) -> str:
    """The measurements as a fixed-width text table, preceded by the peak and the machine."""
    cfg, env, peak = result.config, result.environment, result.peak
    lines = [
        f"gptblock bench: C={cfg.d_model} nh={cfg.n_heads} {cfg.dtype} on {env['device_name']} "
        f"({env['threads']} threads), torch {env['torch']}",
        f"matmul peak: {peak.flops_per_s / 1e9:.1f} GFLOP/s (best median of square "
        f"{'/'.join(str(n) for n in peak.by_size)} matmuls; reached at N={peak.size})",
        "load average before/after: "
        + " / ".join(" ".join(f"{v:.2f}" for v in env[k]) for k in ("load_before", "load_after"))
        + (
            ""
            if env.get("others_cpu_share") is None
            else f"; other processes used {100 * env['others_cpu_share']:.0f}% of the CPUs meanwhile"
        ),
        "",
    ]
    header = f"{'T':>5} {'B':>3}  {'mode':<9}  {'form':<26} {'ms':>8} {'tok/s':>9} "
    header += f"{'% peak':>7} {'x enc':>6} {'peak MiB':>9}  attention"
    lines += [header, "-" * len(header)]
    last = None
    for m in result.measurements:
        if last is not None and (m.seq_len, m.mode) != last:
            lines.append("")
        last = (m.seq_len, m.mode)
        mem = "n/a" if m.peak_memory_bytes is None else f"{m.peak_memory_bytes / 2**20:.1f}"
        name = ROWS[m.form] + (" (ReLU)" if m.form == "lesson" else "")
        lines.append(
            f"{m.seq_len:>5} {m.batch:>3}  {m.mode:<9}  {name:<26} {m.ms:>8.2f} "
            f"{m.tokens_per_s:>9.0f} {m.pct_of_peak:>6.1f}% {m.speedup_vs_encoder_layer:>6.2f} "
            f"{mem:>9}  {m.attention}"
        )
    return "\n".join([*lines, "", *_summary(result.measurements)])


def _summary(rows: list[Measurement]) -> list[str]:
    by = {(m.form, m.mode, m.seq_len): m for m in rows}
    lines = [
        "FusedBlock: speed-up (the other's median time / FusedBlock's); % of the matmul peak "
        "(FusedBlock / matmuls alone)",
        f"{'T':>5} {'B':>3}  {'vs encoder layer':>18}  {'vs lesson':>18}  {'% peak inference':>18}"
        f"  {'% peak training':>18}",
    ]
    for T in dict.fromkeys(m.seq_len for m in rows):
        f = {mode: by["fused", mode, T] for mode in MODES}
        enc = [by["encoder_layer", mode, T].ms / f[mode].ms for mode in MODES]
        les = [by["lesson", mode, T].ms / f[mode].ms for mode in MODES]
        pct = [(f[mode].pct_of_peak, by[MATMULS, mode, T].pct_of_peak) for mode in MODES]
        lines.append(
            f"{T:>5} {f['inference'].batch:>3}  {enc[0]:>8.2f}x {enc[1]:>7.2f}x  "
            f"{les[0]:>8.2f}x {les[1]:>7.2f}x  {pct[0][0]:>8.1f} / {pct[0][1]:>5.1f}%  "
            f"{pct[1][0]:>8.1f} / {pct[1][1]:>5.1f}%"
        )
    lines.append("(vs encoder layer and vs lesson: inference, then training)")
    return lines


def write_json(payload: BenchResult | dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a result (or any JSON-able dict) to ``path`` atomically: whole file or none."""
    data = asdict(payload) if isinstance(payload, BenchResult) else payload
    atomic_write_json(path, data, indent=2, default=str)
