"""The public API is exactly what __all__ says; changing it is a deliberate act."""

import gptblock

EXPECTED = [
    "BlockConfig",
    "CharTokenizer",
    "CheckpointError",
    "ConversionError",
    "Finding",
    "FusedBlock",
    "GPT",
    "GPTConfig",
    "GPTOutput",
    "GenerationStep",
    "KVCache",
    "NonFiniteLossError",
    "RunMeta",
    "TrainConfig",
    "Trainer",
    "CheckReport",
    "TransformerBlock",
    "UserError",
    "__version__",
    "causal_mask",
    "check_block",
    "grade",  # issue 29: a class's submissions into a gradebook
    "exercises",
    "lens",
    "convert",
    "lesson",
    "load",
    "load_gpt",
    "reference",
    "train_gpt",
    # the modern block's parts, alone (issue 20)
    "GroupedQueryAttention",
    "LlamaBlock",
    "RMSNorm",
    "Rotary",
    "SwiGLU",
    "apply_rotary",
    "attention",
    "rmsnorm",
    "swiglu",
]


def test_all_is_pinned():
    assert sorted(gptblock.__all__) == sorted(EXPECTED)


def test_every_name_in_all_exists():
    for name in gptblock.__all__:
        assert hasattr(gptblock, name), name


def test_lesson_module_exports_the_lesson_names():
    assert sorted(gptblock.lesson.__all__) == ["Block", "FeedForward", "Head", "MultiHeadAttention"]
