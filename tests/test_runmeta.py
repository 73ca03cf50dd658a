"""RunMeta: the one owner of a GPT run's checkpoint fields, and its checks on load."""

import copy

import pytest

from gptblock import CharTokenizer, CheckpointError, GPTConfig, RunMeta
from gptblock.runs.checkpoint import Checkpoint
from gptblock.runs.meta import CorpusInfo

TEXT = "hello world, hello gptblock"


def meta():
    tok = CharTokenizer.from_text(TEXT)
    config = GPTConfig(tok.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8)
    return RunMeta(config, tok, CorpusInfo.of(TEXT, "hello.txt"))


def ckpt_of(fields):
    return Checkpoint(fields, {}, "run/last.json", "run/last-x.safetensors")


def test_round_trip_and_the_json_layout():
    m = meta()
    j = m.to_json()
    assert sorted(j) == ["data", "model_config", "vocab"]
    assert j["vocab"] == sorted(set(TEXT)) and j["model_config"]["n_embd"] == 8
    assert j["data"] == {"source": "hello.txt", "characters": len(TEXT), "sha256": m.corpus.sha256}
    assert RunMeta.from_json(j, "x.json") == m


def test_a_run_saved_without_the_corpus_hash_still_reads():
    j = meta().to_json()
    del j["data"]["sha256"]
    assert RunMeta.from_json(j, "x.json").corpus.sha256 is None
    del j["data"]
    assert RunMeta.from_json(j, "x.json").corpus is None


def broken(path, value):
    j = meta().to_json()
    *parents, last = path
    target = j
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return j


@pytest.mark.parametrize(
    "path, value, message",
    [
        (("model_config",), KeyError, "missing field(s) model_config"),
        (("vocab",), KeyError, "missing field(s) vocab"),
        (("model_config",), [1, 2], "field 'model_config' must be an object"),
        (("model_config", "n_head"), 3, "invalid field 'model_config' (n_embd=8 is not divisible"),
        (("model_config", "colour"), "red", "invalid field 'model_config'"),
        (("vocab",), "abc", "invalid field 'vocab'"),
        (("vocab",), ["a", "a"], "invalid field 'vocab' (chars must be distinct"),
        (("vocab",), ["a", "b"], "the vocabulary has 2 characters but model_config says"),
        (("data",), "hello.txt", "field 'data' must be an object"),
        (("data", "characters"), -1, "field 'data.characters' must be an int >= 0"),
        (("data", "source"), 7, "field 'data.source' must be a string"),
        (("data", "sha256"), "abc", "field 'data.sha256' must be a SHA-256"),
    ],
)
def test_every_field_is_checked_and_named(path, value, message):
    with pytest.raises(CheckpointError, match=r"^x\.json: ") as e:
        RunMeta.from_json(broken(path, value), "x.json")
    assert message in str(e.value)


def test_resume_needs_the_same_model_and_vocabulary_but_not_the_same_path():
    m = meta()
    moved = copy.deepcopy(m.to_json())
    moved["data"]["source"] = "elsewhere/hello.txt"
    m.check_resume(ckpt_of(moved))  # the same run, its file moved
    wider = broken(("model_config", "n_embd"), 16)
    with pytest.raises(CheckpointError, match="n_embd=16 in the checkpoint, 8 now"):
        m.check_resume(ckpt_of(wider))
    other = copy.deepcopy(m.to_json())
    other["vocab"] = other["vocab"][::-1]
    with pytest.raises(CheckpointError, match="a different vocab"):
        m.check_resume(ckpt_of(other))


def test_constructor_refuses_mismatched_parts():
    tok = CharTokenizer.from_text("ab")
    with pytest.raises(ValueError, match="vocabulary has 2 characters but model_config says"):
        RunMeta(GPTConfig(3, block_size=4, n_layer=1, n_head=1, n_embd=4), tok)
    with pytest.raises(TypeError, match="model_config must be a GPTConfig"):
        RunMeta({"vocab_size": 2}, tok)
