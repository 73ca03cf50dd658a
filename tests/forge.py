"""Editing a saved checkpoint the way a person (or a bug, or a forger) might, for the misuse tests.

``edit_json`` changes fields of ``NAME.json``; with ``rehash`` it also recomputes
``json_sha256``, as someone who knows the format could, so that the checks behind the hash get
tested too. ``edit_tensors`` rewrites the safetensors file and both hashes.
"""

import hashlib
import json
from pathlib import Path

import safetensors.torch

from gptblock.runs import checkpoint as ck


def read_json(run, kind="last"):
    return json.loads((Path(run) / f"{kind}.json").read_text())


def write_json(run, meta, kind="last", rehash=True):
    if rehash and meta.get("version", 1) >= 2:
        meta["json_sha256"] = ck._fields_sha256(meta)
    (Path(run) / f"{kind}.json").write_text(json.dumps(meta))


def edit_json(run, change, kind="last", rehash=True):
    """``change(meta)`` edits the parsed JSON in place; the file is written back."""
    meta = read_json(run, kind)
    change(meta)
    write_json(run, meta, kind, rehash)


def edit_tensors(run, change, kind="last"):
    """``change(tensors)`` edits the dict of stored tensors in place; both hashes follow."""
    meta = read_json(run, kind)
    path = Path(run) / meta["tensors"]
    tensors = safetensors.torch.load(path.read_bytes())
    change(tensors)
    blob = safetensors.torch.save(tensors)
    path.write_bytes(blob)
    meta["sha256"] = hashlib.sha256(blob).hexdigest()
    write_json(run, meta, kind)


def set_path(meta, dotted, value):
    """``meta["a"]["b"] = value`` for ``dotted == "a.b"``."""
    *parents, last = dotted.split(".")
    for key in parents:
        meta = meta[key]
    meta[last] = value
