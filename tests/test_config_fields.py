"""The model's and the training's fields are declared once (issue 30, item 1): ``GPTConfig`` and
``TrainConfig`` hold each with its help; ``BlockConfig``, ``ModernOptions``, ``RunSettings`` and
``gptblock train``'s flags take them by name from there."""

import dataclasses
import re

import pytest

from gptblock import BlockConfig, FusedBlock, GPTConfig, TransformerBlock
from gptblock.blocks.config import BlockOptions
from gptblock.cli import build_parser
from gptblock.reference.modern import ModernOptions
from gptblock.train.config import TrainConfig
from gptblock.train.presets import preset_settings
from gptblock.train.settings import SETTINGS, RunSettings

# What a run decides otherwise than the configs: the tokenizer's vocabulary, and "auto".
RUN_OWN = {"vocab_size", "device", "dtype", "tokenizer"}


def names(cls):
    return {f.name for f in dataclasses.fields(cls)}


def test_every_config_field_says_what_it_is():
    for cls in (GPTConfig, TrainConfig, RunSettings):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"


def test_the_block_and_the_oracle_use_gptconfigs_names():
    assert names(BlockOptions) < names(GPTConfig)
    assert names(BlockConfig) - names(GPTConfig) == {"d_model"}  # the block's C, n_embd's
    assert names(ModernOptions) < names(BlockConfig)
    config = GPTConfig(65, 16, 1, 4, 32, n_kv_head=2, position="rope", qk_norm=True, d_ff=48)
    block = config.block_config()
    assert {n: getattr(block, n) for n in names(BlockOptions)} == {
        n: getattr(config, n) for n in names(BlockOptions)
    }
    assert (block.d_model, block.n_head, block.modern) == (
        32,
        4,
        ("qk_norm", "position", "d_ff", "n_kv_head"),
    )


def test_run_settings_take_the_configs_fields_not_copies():
    run = {f.name: f for f in dataclasses.fields(RunSettings)}
    assert set(run) == names(GPTConfig) | names(TrainConfig) | {"tokenizer"}
    for cls in (GPTConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            if f.name not in RUN_OWN and not (cls is GPTConfig and f.name == "block_size"):
                # the config's own field: the same help, choices and default
                assert run[f.name].metadata is f.metadata, f.name
                assert run[f.name].default == f.default, f.name


def test_every_config_field_is_a_train_flag():
    args = build_parser().parse_args(
        ["train", "--preset", "tiny", "--grad-clip", "0.5", "--beta1", "0.8", "--norm-eps",
         "1e-6", "--log-interval", "5", "--block", "mha", "--n-kv-head", "4"]
    )  # fmt: skip
    s = preset_settings(args.preset, {name: getattr(args, name) for name in SETTINGS})
    train = s.train_config(dtype="float32", device="cpu")
    model = s.model_config(vocab_size=65)
    assert (train.grad_clip, train.beta1, train.log_interval) == (0.5, 0.8, 5)
    assert (model.norm_eps, model.block, model.n_kv_head) == (1e-6, "mha", 4)
    with pytest.raises(SystemExit):  # choices from the field's metadata
        build_parser().parse_args(["train", "--block", "conv"])


def test_the_blocks_keep_their_older_keywords():
    old = FusedBlock(16, 4, n_kv_heads=2, rope=True).config
    assert old == FusedBlock(16, 4, n_kv_head=2, position="rope").config
    assert (old.n_kv_head, old.position) == (2, "rope")
    assert FusedBlock(16, 4, rope=False).config.position == "learned"
    with pytest.raises(TypeError, match=r"rope must be a bool, got 1"):
        FusedBlock(16, 4, rope=1)
    with pytest.raises(ValueError, match=r"cannot express n_kv_head=1"):
        TransformerBlock(16, 2, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"d_model=16 is not divisible by n_heads=3"):
        FusedBlock(16, 3)  # named as the constructor's argument


def test_only_the_shape_of_a_gptconfig_is_positional():
    assert GPTConfig(13, 8, 1, 2, 16).n_embd == 16
    with pytest.raises(TypeError):  # the sixth was dropout once: by name, never misread
        GPTConfig(13, 8, 1, 2, 16, 0.1)
    with pytest.raises(TypeError):
        BlockConfig(16, 2, 0.1)


def test_a_block_without_rotary_positions_is_gpt2s_whatever_the_models_positions():
    # position='none' is the model's business (no wpe): its blocks are GPT-2's, any form.
    config = GPTConfig(13, 8, 1, 2, 16, position="none", block="mha")
    assert config.block_config().modern == ()
    assert BlockConfig(16, 2, position="rope").modern == ("position",)


def test_a_number_outside_its_fields_interval_is_named():
    # The interval is declared with the field (metadata "within") and checked from there.
    for f in dataclasses.fields(TrainConfig):
        if within := f.metadata["within"]:
            low, high = (float(end) for end in within[1:-1].split(","))
            outside = [
                low if within[0] == "(" else low - 1,
                high if within[-1] == ")" else high + 1,
            ]
            for value in [*outside, float("nan")]:
                with pytest.raises(
                    ValueError, match=rf"^{f.name} must be in {re.escape(within)}, got"
                ):
                    TrainConfig(**{f.name: value})
            with pytest.raises(TypeError, match=rf"^{f.name} must be a float, got '1'"):
                TrainConfig(**{f.name: "1"})
    assert {f.name for f in dataclasses.fields(TrainConfig) if f.metadata["within"]} >= {
        "lr", "beta1", "beta2", "weight_decay", "grad_clip", "muon_lr", "decay_fraction"
    }  # fmt: skip


# --- settings that act only beside another's value (issue 31, item 2) ---------------------------

SHAPE = dict(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16)


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: GPTConfig(**SHAPE, rotary_dim=4), "rotary_dim=4 acts only with position='rope'"),
        (lambda: GPTConfig(**SHAPE, position="none", rope_theta=5.0), "but position is 'none'"),
        (lambda: GPTConfig(**SHAPE, mlp="swiglu", activation="relu"), "but mlp is 'swiglu'"),
        (lambda: BlockConfig(d_model=16, n_head=2, rope_pairing="adjacent"), "rope_pairing="),
        (lambda: TrainConfig(decay_fraction=0.5), "but schedule is 'cosine'"),
        (lambda: TrainConfig(muon_momentum=0.9), "but optimizer is 'adamw'"),
        (lambda: RunSettings(**SHAPE | {"vocab_size": 300}), "but tokenizer is 'char'"),
    ],
)
def test_a_setting_that_cannot_act_is_refused_naming_both(make, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        make()


def test_a_default_is_not_a_setting_given():
    assert GPTConfig(**SHAPE, mlp="swiglu", activation="gelu").mlp == "swiglu"
    assert TrainConfig(decay_fraction=0.2).schedule == "cosine"


def test_every_dependency_names_a_field_and_one_of_its_values():
    for cls in (GPTConfig, TrainConfig, RunSettings):
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        for f in by_name.values():
            if acts_with := f.metadata.get("acts_with"):
                other, value = acts_with
                assert value in by_name[other].metadata["choices"], (cls, f.name)


def test_a_presets_value_that_the_given_settings_leave_unused_is_dropped():
    s = preset_settings("shakespeare-cpu", {"schedule": "cosine", "optimizer": "adamw"})
    assert (s.decay_fraction, s.muon_lr) == (0.2, 0.02)  # the defaults: they cannot act
    modern = preset_settings("shakespeare-cpu-modern", {"position": "learned"})
    assert modern.rope_theta == 10000.0
    with pytest.raises(ValueError, match=r"rope_theta=100\.0 acts only"):
        preset_settings("shakespeare-cpu-modern", {"position": "learned", "rope_theta": 100.0})
