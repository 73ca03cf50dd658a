"""nanoGPT checkpoints load as gptblock's GPT with the same logits, and nothing in them runs."""

import os
import pickle

import pytest
import torch

from gptblock.errors import UserError
from gptblock.interop.nanogpt import from_nanogpt
from nanogpt_style import NanoGPT


def save(tmp_path, model, **kw):
    torch.save(model.checkpoint(**kw), tmp_path / "ckpt.pt")
    return tmp_path


@pytest.mark.parametrize(
    "shape, bias, tied, compiled",
    [
        ((50, 16, 2, 2, 16), True, True, False),
        ((65, 24, 3, 4, 32), False, True, True),
        ((30, 8, 1, 1, 8), True, False, False),
    ],
)
def test_logits_are_nanogpts(tmp_path, shape, bias, tied, compiled):
    torch.manual_seed(0)
    theirs = NanoGPT(*shape, bias=bias, tied=tied).eval()
    ours, vocab = from_nanogpt(save(tmp_path, theirs, compiled=compiled))
    assert vocab is None and ours.config.bias == bias and ours.config.tie_embeddings == tied
    idx = torch.randint(0, shape[0], (3, shape[1]))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, theirs(idx), atol=1e-5, rtol=1e-5)
    # The same from the ckpt.pt path itself, and in the "mha" block form.
    mha, _ = from_nanogpt(tmp_path / "ckpt.pt", block="mha")
    with torch.no_grad():
        torch.testing.assert_close(mha(idx).logits, theirs(idx), atol=1e-5, rtol=1e-5)


def test_meta_pkl_gives_the_character_vocabulary(tmp_path):
    torch.manual_seed(0)
    save(tmp_path, NanoGPT(5, 8, 1, 1, 8))
    chars = ["\n", " ", "a", "b", "é"]
    meta = {
        "vocab_size": 5,
        "itos": dict(enumerate(chars)),
        "stoi": {c: i for i, c in enumerate(chars)},
    }
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(meta))
    _, tok = from_nanogpt(tmp_path)
    assert tok.chars == tuple(chars) and tok.decode(tok.encode("ab é")) == "ab é"


class WritesAMarker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": {}, "model_args": {}, "x": WritesAMarker(marker)}, tmp_path / "ckpt.pt")
    with pytest.raises(UserError, match="refused"):
        from_nanogpt(tmp_path)
    assert not marker.exists()


def test_a_meta_pkl_that_would_run_code_is_refused_without_running_it(tmp_path):
    torch.manual_seed(0)
    save(tmp_path, NanoGPT(5, 8, 1, 1, 8))
    marker = tmp_path / "pwned"
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"itos": WritesAMarker(marker)}))
    with pytest.raises(UserError, match=r"refused to load (posix|os)\.system"):
        from_nanogpt(tmp_path)
    assert not marker.exists()


def test_not_a_nanogpt_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no nanoGPT checkpoint"):
        from_nanogpt(tmp_path)
    torch.save({"model": {}, "model_args": {"n_layer": 1}}, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="model_args lacks n_head, n_embd, block_size, vocab_size"):
        from_nanogpt(tmp_path)
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"not a readable PyTorch checkpoint|refused"):
        from_nanogpt(tmp_path)
