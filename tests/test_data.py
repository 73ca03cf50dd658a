"""The corpus, tokenizer, split and batches: checked against direct slicing of the text."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptblock.data.batches import CharTokenizer, full_windows, get_batch, split_tokens
from gptblock.data.text import default_corpus, read_text

ANY_CHARACTER = st.characters(exclude_categories=())  # lone surrogates too


def test_default_corpus_is_english_prose_and_stable():
    text = default_corpus()
    assert len(text) > 400_000
    assert text == default_corpus()  # sorted key order: the same text every time
    words = text.split()
    common = sum(w.lower() in {"the", "of", "a", "is", "to", "and"} for w in words)
    assert common / len(words) > 0.1
    assert CharTokenizer.from_text(text).vocab_size < 200


@settings(max_examples=200, deadline=None)
@given(
    st.text(ANY_CHARACTER, min_size=1), st.text(ANY_CHARACTER), st.randoms(use_true_random=False)
)
def test_vectorised_vocabulary_and_encoding_are_the_python_ones(text, other, rnd):
    # from_text and encode_tensor look code points up in numpy tables; the oracle is the
    # per-character Python: sorted(set(text)) and encode's dict lookups (lone surrogates,
    # astral characters and NUL included), with ids in any order.
    assert CharTokenizer.from_text(text).chars == tuple(sorted(set(text)))
    chars = sorted(set(text))
    rnd.shuffle(chars)
    tok = CharTokenizer(chars)
    assert tok.encode_tensor(text).tolist() == tok.encode(text)
    assert tok.encode_tensor("").tolist() == []
    if set(other) - set(chars):
        with pytest.raises(ValueError) as raised:
            tok.encode_tensor(other)
        with pytest.raises(ValueError) as expected:
            tok.encode(other)
        assert str(raised.value) == str(expected.value)
    else:
        assert tok.encode_tensor(other).tolist() == tok.encode(other)


def test_encoding_the_corpus_is_the_python_encoding():
    text = default_corpus()
    tok = CharTokenizer.from_text(text)
    assert tok.chars == tuple(sorted(set(text)))
    assert torch.equal(tok.encode_tensor(text), torch.tensor(tok.encode(text)))


def test_tokenizer_vocabulary_is_the_sorted_character_set():
    text = "the cat sat\non the mat, naïve"
    tok = CharTokenizer.from_text(text)
    assert list(tok.chars) == sorted(set(text))
    ids = tok.encode(text)
    assert ids == [sorted(set(text)).index(c) for c in text]
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text


def test_tokenizer_saves_as_plain_json():
    tok = CharTokenizer.from_text('héllo\n\t"{}')
    restored = CharTokenizer.from_json(json.loads(json.dumps(tok.to_json())))
    assert restored == tok and restored.encode("héllo") == tok.encode("héllo")


def test_unknown_characters_are_listed():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"2 characters outside the vocabulary: 'x', 'z'"):
        tok.encode("abzx")


@pytest.mark.parametrize(
    "chars, error",
    [([], ValueError), (["a", "a"], ValueError), (["ab"], TypeError), ("abc", TypeError)],
)
def test_bad_vocabularies_are_rejected(chars, error):
    with pytest.raises(error):
        CharTokenizer(chars)


def test_decode_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"\[5\] are outside the vocabulary \[0, 3\)"):
        CharTokenizer.from_text("abc").decode([0, 5])


def test_read_text_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_text(tmp_path / "missing.txt")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        read_text(tmp_path)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.txt is empty"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"not UTF-8 text: byte 0xe9 at offset 3"):
        read_text(tmp_path / "latin1.txt")
    (tmp_path / "ok.txt").write_text("naïve\n", encoding="utf-8")
    assert read_text(tmp_path / "ok.txt") == "naïve\n"


def test_split_keeps_the_first_ninety_percent_for_training():
    ids = list(range(1000))
    s = split_tokens(ids, block_size=8)
    assert s.train.tolist() == ids[:900] and s.val.tolist() == ids[900:]
    assert s.train.dtype == torch.long


@pytest.mark.parametrize("n", range(70, 100))
def test_split_too_short_names_the_minimum(n):
    # The message's minimum must be exact: that length works and one less does not.
    try:
        split_tokens(list(range(n)), block_size=8)
    except ValueError as e:
        minimum = int(str(e).split("at least ")[1].split()[0])
        assert minimum > n
        split_tokens(list(range(minimum)), block_size=8)
        with pytest.raises(ValueError):
            split_tokens(list(range(minimum - 1)), block_size=8)


def test_batches_are_windows_of_the_data():
    data = torch.randint(0, 50, (500,), generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(3)
    x, y = get_batch(data, 16, 6, g)
    assert x.shape == y.shape == (6, 16)
    ix = torch.randint(500 - 16, (6,), generator=torch.Generator().manual_seed(3))
    for row, i in enumerate(ix.tolist()):
        assert x[row].tolist() == data[i : i + 16].tolist()
        assert y[row].tolist() == data[i + 1 : i + 17].tolist()


def test_ranks_share_out_the_same_global_batch():
    data = torch.arange(300)
    whole, _ = get_batch(data, 8, 6, torch.Generator().manual_seed(5))
    gens = [torch.Generator().manual_seed(5) for _ in range(3)]
    parts = [get_batch(data, 8, 6, g, rank=r, world_size=3)[0] for r, g in enumerate(gens)]
    assert torch.equal(torch.cat(parts), whole)
    # Every rank's generator advanced the same way, so the next global batch agrees too.
    assert all(torch.equal(g.get_state(), gens[0].get_state()) for g in gens)
    with pytest.raises(
        ValueError, match="batch_size=6 must be divisible by the number of processes 4"
    ):
        get_batch(data, 8, 6, gens[0], rank=0, world_size=4)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 120), block_size=st.integers(1, 17), batch_size=st.integers(1, 9))
def test_full_windows_predict_every_token_once(n, block_size, batch_size):
    data = torch.arange(n)
    batches = full_windows(data, block_size, batch_size)
    xs = torch.cat([x.flatten() for x, _ in batches])
    ys = torch.cat([y.flatten() for _, y in batches])
    assert torch.equal(xs, data[:-1]) and torch.equal(ys, data[1:])
    for x, y in batches:
        assert x.shape == y.shape and x.shape[0] <= batch_size and x.shape[1] <= block_size
