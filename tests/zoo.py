"""A zoo of transformer blocks with the mistakes learners make, for testing `gptblock check`.

None of these inherits from a gptblock class: the checker must work on anyone's code. The blocks,
written the ways learners write them, live in ``zoo_lesson`` (the first lesson's code, one step
per method, so that a mistake is a subclass overriding the one line it gets wrong) and
``zoo_torch`` (``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` blocks, nanoGPT and
GPT-2 layouts, and blocks whose names the checker cannot map).

``ZOO`` lists each mistaken block with its constructor arguments and expected diagnosis;
``CORRECT`` lists correct blocks the checker must pass.
"""

from zoo_lesson import (
    LessonAttnOverwrites,
    LessonBlock,
    LessonCatAlongTime,
    LessonDivideByHs,
    LessonDropoutInEval,
    LessonLastPositionOnly,
    LessonMlpOverwrites,
    LessonNoMask,
    LessonNoResidualScaleByC,
    LessonNormalisedStream,
    LessonNormWithoutEps,
    LessonNoScaling,
    LessonPostNorm,
    LessonPostNormNaiveSoftmax,
    LessonPostNormNoMaskScaleByC,
    LessonPostNormNoScaling,
    LessonPostNormSoftmaxDim,
    LessonReversedMask,
    LessonReversedMaskNoScaling,
    LessonScaleByC,
    LessonSoftmaxDim,
)
from zoo_torch import (
    Gpt2Block,
    MhaBlock,
    MhaFunctionalDropout,
    MhaNoMask,
    MhaNotBatchFirst,
    MhaTrilMask,
    NanoBlock,
    NanoFlashBlock,
    NanoFlashDropoutAlways,
    NanoScaleByC,
    NanoSdpaReversedMask,
    Opaque,
    OpaqueNoMask,
    Wrapped,
    wrapped_post_norm,
    wrapped_seq_first_unmasked,
)

LESSON_ARGS = {"n_embd": 32, "n_head": 4, "block_size": 16, "dropout": 0.1}
MHA_ARGS = {"d_model": 32, "n_heads": 4, "dropout": 0.1}
WRAPPED_ARGS = {"d_model": 32, "nhead": 4, "dropout": 0.1}

# name: (factory, constructor arguments, expected diagnosis)
ZOO = {
    "lesson/no_scaling": (LessonNoScaling, LESSON_ARGS, ["no_scaling"]),
    "lesson/scale_by_C": (LessonScaleByC, LESSON_ARGS, ["wrong_scale"]),
    "lesson/divide_by_hs": (LessonDivideByHs, LESSON_ARGS, ["wrong_scale"]),
    "lesson/no_mask": (LessonNoMask, LESSON_ARGS, ["future_leak"]),
    "lesson/reversed_mask": (LessonReversedMask, LESSON_ARGS, ["mask_reversed"]),
    "lesson/softmax_dim": (LessonSoftmaxDim, LESSON_ARGS, ["softmax_dim"]),
    "lesson/dropout_in_eval": (LessonDropoutInEval, LESSON_ARGS, ["dropout_in_eval"]),
    "lesson/post_norm": (LessonPostNorm, LESSON_ARGS, ["post_norm"]),
    "lesson/attn_overwrites": (LessonAttnOverwrites, LESSON_ARGS, ["no_residual"]),
    "lesson/mlp_overwrites": (LessonMlpOverwrites, LESSON_ARGS, ["no_residual"]),
    "lesson/normalised_stream": (LessonNormalisedStream, LESSON_ARGS, ["no_residual"]),
    "lesson/norm_without_eps": (LessonNormWithoutEps, LESSON_ARGS, ["nonfinite"]),
    "lesson/last_position_only": (LessonLastPositionOnly, LESSON_ARGS, ["shape"]),
    "lesson/cat_along_time": (LessonCatAlongTime, LESSON_ARGS, ["shape"]),
    "lesson/post_norm+no_scaling": (
        LessonPostNormNoScaling,
        LESSON_ARGS,
        ["no_scaling", "post_norm"],
    ),
    "lesson/post_norm+softmax_dim": (
        LessonPostNormSoftmaxDim,
        LESSON_ARGS,
        ["softmax_dim", "post_norm"],
    ),
    "lesson/no_residual+wrong_scale": (
        LessonNoResidualScaleByC,
        LESSON_ARGS,
        ["wrong_scale", "no_residual"],
    ),
    "lesson/mask_reversed+no_scaling": (
        LessonReversedMaskNoScaling,
        LESSON_ARGS,
        ["mask_reversed", "no_scaling"],
    ),
    "lesson/future_leak+wrong_scale+post_norm": (
        LessonPostNormNoMaskScaleByC,
        LESSON_ARGS,
        ["future_leak", "wrong_scale", "post_norm"],
    ),
    "lesson/post_norm+naive_softmax": (
        LessonPostNormNaiveSoftmax,
        LESSON_ARGS,
        ["post_norm", "nonfinite"],
    ),
    "mha/not_batch_first": (MhaNotBatchFirst, MHA_ARGS, ["batch_mixing"]),
    "mha/tril_mask": (MhaTrilMask, MHA_ARGS, ["mask_reversed"]),
    "mha/no_mask": (MhaNoMask, MHA_ARGS, ["future_leak"]),
    "mha/functional_dropout": (MhaFunctionalDropout, MHA_ARGS, ["dropout_in_eval"]),
    "wrapped/post_norm": (wrapped_post_norm, WRAPPED_ARGS, ["post_norm"]),
    "wrapped/seq_first_unmasked": (
        wrapped_seq_first_unmasked,
        WRAPPED_ARGS,
        ["future_leak", "batch_mixing"],
    ),
    "nano/scale_by_C": (NanoScaleByC, LESSON_ARGS, ["wrong_scale"]),
    "nano/sdpa_reversed_mask": (NanoSdpaReversedMask, LESSON_ARGS, ["mask_reversed"]),
    "nano/sdpa_dropout_always": (NanoFlashDropoutAlways, LESSON_ARGS, ["dropout_in_eval"]),
    "opaque/no_mask": (OpaqueNoMask, {"n_embd": 32, "n_head": 4}, ["future_leak"]),
}

# Correct blocks written outside gptblock: name -> factory(C, nh, dropout)
CORRECT = {
    "zoo-lesson": lambda C, nh, p: LessonBlock(C, nh, 16, p),
    "zoo-mha": lambda C, nh, p: MhaBlock(C, nh, p),
    "wrapped-encoder-layer": lambda C, nh, p: Wrapped(C, nh, p),
    "nanogpt": lambda C, nh, p: NanoBlock(C, nh, 16, p),
    "nanogpt-flash": lambda C, nh, p: NanoFlashBlock(C, nh, 16, p),
    "gpt2-conv1d": lambda C, nh, p: Gpt2Block(C, nh, 16, p),
    "opaque": lambda C, nh, p: Opaque(C, nh, p),
}
