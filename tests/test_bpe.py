"""Byte-level BPE from Hugging Face's tokenizers: trained here, or read from a GPT-2 directory."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")
from gptblock.data.bpe import BPETokenizer
from gptblock.data.text import default_corpus

TEXT = default_corpus()[:20_000]


@pytest.fixture(scope="module")
def tok():
    return BPETokenizer.train(TEXT, vocab_size=400)


def test_training_learns_merges_that_shorten_the_text(tok):
    assert tok.vocab_size == 400
    assert len(tok.encode(TEXT)) < 0.6 * len(TEXT)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60))
def test_every_string_round_trips(tok, text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.unknown(text) == []


def test_json_round_trip_and_equality(tok):
    again = BPETokenizer.from_json(tok.to_json())
    assert again == tok and again.encode("the cat") == tok.encode("the cat")
    with pytest.raises(ValueError, match="not a saved tokenizer"):
        BPETokenizer.from_json("{}")
    with pytest.raises(TypeError, match="JSON string"):
        BPETokenizer.from_json(["a"])


def test_reads_a_directory_with_tokenizer_json_or_vocab_and_merges(tok, tmp_path):
    (tmp_path / "a").mkdir()
    tok.tokenizer.save(str(tmp_path / "a" / "tokenizer.json"))
    assert BPETokenizer.from_directory(tmp_path / "a").encode(TEXT[:500]) == tok.encode(TEXT[:500])
    (tmp_path / "b").mkdir()
    tok.tokenizer.model.save(str(tmp_path / "b"))  # vocab.json + merges.txt, GPT-2's files
    assert BPETokenizer.from_directory(tmp_path / "b").encode(TEXT[:500]) == tok.encode(TEXT[:500])
    with pytest.raises(FileNotFoundError, match=r"expected tokenizer\.json, or vocab\.json"):
        BPETokenizer.from_directory(tmp_path)


def test_bad_sizes_and_ids(tok):
    with pytest.raises(ValueError, match="at least 256"):
        BPETokenizer.train(TEXT, vocab_size=100)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 400\)"):
        tok.decode([5, 400])
