"""``gptblock bench``: the matmul peak, then every form of the block, timed in one process."""

from __future__ import annotations

import argparse
import sys

from ..bench.report import format_table, write_json
from ..bench.suite import QUICK, BenchConfig, device_unavailable, run_benchmark
from ..devices import DTYPES, set_threads
from ..errors import UserValueError
from ..files import check_destination
from .formatting import RawEpilogHelpFormatter, add_command

EPILOG = """\
ms: median of --repeats calls after --warmup untimed ones, the forms timed round-robin.
Model FLOPs (nanoGPT's estimate_mfu for one layer, causal attention counted at half the T x T),
per token: 6*N + 6*C*T for a training step (forward + backward), 2*N + 2*C*T for inference,
N = 12*C^2 + 13*C.
% peak: achieved model FLOP/s over the matmul peak, the best over square NxN @ NxN matmuls
(N = 1024/2048/4096 on CPU, 4096/8192/16384 on CUDA) of the median FLOP/s, in the benchmark's
dtype, measured before and after the blocks.
x enc: nn.TransformerEncoderLayer's median time over this form's (> 1: faster).
peak MiB: tensor memory above the call's start (CUDA allocator stats; on CPU the profiler's
allocation events).
matmuls alone (ceiling): the block's matmuls and nothing else; no form can be faster.
The sweep keeps B*T constant.

Exit codes: 0 done, or skipped because the requested device is not available (the message
says so, and --json then records {"skipped": reason}); 2 bad arguments.
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = BenchConfig()
    p = add_command(
        sub,
        "bench",
        run,
        RawEpilogHelpFormatter,
        description="Measure the matmul peak, then each block form (lesson Block,\n"
        "TransformerBlock, FusedBlock, nn.TransformerEncoderLayer) for inference and a\n"
        "training step, at one shape and a sweep over T.",
        epilog=EPILOG,
    )
    p.add_argument("--d-model", type=int, default=d.d_model, help="C")
    p.add_argument("--heads", type=int, default=d.n_heads, help="nh")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="T of the main shape")
    p.add_argument("--batch", type=int, default=d.batch, help="B of the main shape")
    p.add_argument(
        "--sweep",
        type=int,
        nargs="*",
        default=list(d.sweep),
        help="further T, each at batch B*T/T_sweep (nothing after --sweep: no sweep)",
    )
    p.add_argument(
        "--activation",
        choices=["gelu", "relu"],
        default=d.activation,
        help="of every form but the lesson's, which is ReLU",
    )
    p.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=d.dtype, help="of everything timed")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed calls first")
    p.add_argument("--repeats", type=int, default=d.repeats, help="timed calls (median)")
    p.add_argument(
        "--peak-sizes", type=int, nargs="+", help="N of the peak matmuls (None: by device)"
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (None: torch's choice)")
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes, seconds: tests the pipeline only"
    )
    p.add_argument("--json", metavar="FILE", help="also write every number here (atomically)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


DEFAULTS = BenchConfig()
FLAGS = {"n_heads": "heads"}  # BenchConfig fields whose flag has another name
# In the order --quick's refusal names them.
FIELDS = "d_model n_heads seq_len batch sweep activation device dtype warmup repeats peak_sizes"


def run(args: argparse.Namespace) -> int:
    why = device_unavailable(args.device)
    if why is not None and args.device.startswith("cuda"):
        print(f"gptblock bench: skipped: {why}", file=sys.stderr)
        if args.json:
            write_json({"skipped": why}, args.json)
        return 0
    if args.json:
        check_destination(args.json)  # now, not after the benchmark
    if args.threads is not None:
        set_threads(args.threads)
    options = {name: getattr(args, FLAGS.get(name, name)) for name in FIELDS.split()}
    options |= {"sweep": tuple(args.sweep), "peak_sizes": tuple(args.peak_sizes or ())}
    config = BenchConfig(**options)  # every value given is checked, --quick or not
    if args.quick:
        given = {k: v for k, v in options.items() if k in QUICK and v != getattr(DEFAULTS, k)}
        if given:
            flags = ", ".join(f"--{FLAGS.get(k, k).replace('_', '-')}" for k in given)
            raise UserValueError(
                f"--quick chooses its own sizes, so {flags} would be ignored: give --quick or "
                f"{flags}, not both"
            )
        config = BenchConfig(**(options | QUICK))
    result = run_benchmark(config, progress=not args.no_progress)
    print(format_table(result))
    if args.json:
        write_json(result, args.json)
        print(f"wrote {args.json}")
    return 0
