"""``gptblock inspect``: what a trained model does with one prompt, inside (``gptblock.lens``)."""

from __future__ import annotations

import argparse
import math

from ..files import check_destination, make_directory
from ..lens import FIGURE_FILES, PromptInspection, inspect_prompt, save_attention_page, save_figures
from .formatting import add_command, add_threads_option
from .options import add_source_options, load_source


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub,
        "inspect",
        run,
        description="Load the best checkpoint of a `gptblock train` run, run it once on the "
        "prompt with every activation cached, and print the likeliest next tokens, the logit "
        "lens (each layer's top token) and a table of the heads. --hf and --nanogpt read "
        "other tools' models instead.",
    )
    add_source_options(p)
    p.add_argument("--prompt", required=True, help="the text to look at, up to block_size long")
    p.add_argument("--top-k", type=int, default=5, help="how many next tokens to list")
    p.add_argument(
        "--png",
        metavar="DIR",
        help="also write attention.png, attribution.png and logit_lens.png into DIR",
    )
    p.add_argument(
        "--html", metavar="FILE", help="also write a self-contained attention viewer page"
    )
    add_threads_option(p)


def run(args: argparse.Namespace) -> int:
    if args.html:
        check_destination(args.html)  # before the model is loaded and run
    if args.png:
        for name in FIGURE_FILES:
            check_destination(make_directory(args.png) / name)
    model, tokenizer, source = load_source(args)
    seen = inspect_prompt(model, tokenizer, args.prompt, top_k=args.top_k)
    c = model.config
    print(
        f"{args.prompt!r} on {source.path} ({source.what}, n_layer {c.n_layer}, n_head {c.n_head})"
    )
    _print_report(seen)
    if args.png:
        for path in save_figures(seen, args.png):
            print(f"wrote {path}")
    if args.html:
        save_attention_page(seen, args.html)
        print(f"wrote {args.html}")
    return 0


def _print_report(seen: PromptInspection) -> None:
    print("\nnext token  probability")
    for i, p in seen.top:
        print(f"  {seen.vocab[i]!r:<9} {p:.3f}")

    print("\nlogit lens at the last position: the stream after each layer, read as the output")
    last = seen.lens.probs[:, -1]  # (L + 1, V)
    for label, row in zip(seen.lens.labels, last, strict=True):
        p, i = row.max(dim=-1)
        print(f"  {label:<9} {seen.vocab[int(i)]!r:<9} {float(p):.3f}")

    a = seen.attribution
    ranked = sorted(zip(a.labels, a.values.tolist(), strict=True), key=lambda x: -abs(x[1]))
    print(
        f"\ndirect logit attribution of {seen.vocab[a.token]!r}: logit {a.logit:.3f} = "
        f"components {float(a.values.sum()):.3f} + biases {a.bias:.3f}; the largest:"
    )
    print("  " + ", ".join(f"{label} {v:+.3f}" for label, v in ranked[:6]))

    T = len(seen.tokens)
    uniform = sum(math.log2(t + 1) for t in range(T)) / T
    print(
        f"\nheads: entropy in bits and distance back, means over the {T} positions "
        f"(uniform attention: {uniform:.2f} bits)"
    )
    print("  layer head  entropy  distance  last position attends most to")
    for h in seen.heads:
        top = f"{seen.tokens[h.top_position]!r} at {h.top_position} ({h.top_weight:.2f})"
        print(f"  {h.layer:<5} {h.head:<5} {h.entropy:<8.2f} {h.distance:<9.2f} {top}")
