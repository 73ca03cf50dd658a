"""Weight mapping between the four forms of the block: ``convert(module, to)``.

The forms: ``"lesson"`` (``gptblock.lesson.Block``: a q/k/v ``Linear`` per head, no q/k/v bias,
ReLU, eps 1e-5), ``"mha"`` (``TransformerBlock``), ``"fused"`` (``FusedBlock``) and
``"encoder_layer"`` (``nn.TransformerEncoderLayer(norm_first=True, batch_first=True)``, called
with ``src_mask=causal_mask(T), is_causal=True``). Each converts through one hub rather than
twelve pairwise mappings: a ``BlockConfig`` and a state_dict in ``TransformerBlock``'s layout
(``describe``). "The same function": the same outputs in eval mode (the lesson places its
dropouts elsewhere); where it cannot be kept, ``ConversionError`` says why.

Shapes: B batch, T time, C = d_model channels, nh = n_heads heads, hs = C // nh.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UserTypeError, UserValueError
from ..lesson import Block
from ..reference.layout import IN_PROJ, LESSON_RENAMES, LESSON_TRIL, lesson_head, lesson_qkv_keys
from .config import BlockConfig, activation_function, activation_name, check_positive_int
from .fused import BlockParts, FusedBlock
from .mha import TransformerBlock

__all__ = ["FORMS", "ConversionError", "convert", "describe", "parts_of"]

FORMS = ("lesson", "mha", "fused", "encoder_layer")
LESSON_EPS = 1e-5  # nn.LayerNorm's default, which the lesson's Block uses and cannot change

State = dict[str, torch.Tensor]


class ConversionError(UserValueError):
    """A conversion between block forms would change the function the block computes."""


def convert(module: nn.Module, to: str, *, block_size: int | None = None) -> nn.Module:
    """Return a new block of form ``to`` that computes the same function as ``module``.

    Parameters are copied (never shared); dtype, device, train/eval mode and the options are
    kept. ``module`` is any form (an encoder layer pre-norm, batch-first, with
    ``dim_feedforward = 4 * d_model``). ``block_size``, the new lesson ``Block``'s longest
    sequence, is only for ``to="lesson"`` and required there unless ``module`` is a lesson
    block: too small refuses real inputs, too large allocates a (block_size, block_size) mask
    per head. ``ConversionError`` says why the target cannot compute ``module``'s function (a
    nonzero q/k/v bias, GELU or another eps to the lesson; a post-norm encoder layer ...).

    Example:
        >>> from gptblock import FusedBlock, convert, lesson
        >>> block = lesson.Block(n_embd=16, n_head=2, block_size=8, dropout=0.0).eval()
        >>> fast = convert(block, "fused")
        >>> type(fast).__name__, fast.config.activation
        ('FusedBlock', 'relu')
        >>> x = torch.randn(2, 5, 16)
        >>> torch.allclose(fast(x), block(x), atol=1e-5)
        True
        >>> back = convert(fast, "lesson", block_size=8)
        >>> torch.allclose(back(x), block(x), atol=1e-5)
        True
        >>> convert(FusedBlock(16, 2), "lesson", block_size=8)  # GELU by default
        Traceback (most recent call last):
        ...
        gptblock.blocks.convert.ConversionError: cannot convert to 'lesson': the lesson's FeedForward uses ReLU, this block uses 'gelu'
    """
    if to not in FORMS:
        raise UserValueError(f"to must be one of {FORMS}, got {to!r}")
    if block_size is not None and to != "lesson":
        raise UserValueError(f"block_size applies only to to='lesson', got to={to!r}")
    config, described = describe(module)
    if config.modern and to != "fused":
        name = config.modern[0]
        raise ConversionError(
            f"cannot convert to {to!r}: it has GPT-2's block, which cannot express "
            f"{name}={getattr(config, name)!r} (the modern block's options need 'fused')"
        )
    state = {name: t.detach().clone() for name, t in described.items()}  # never sharing storage
    reference = next(module.parameters())
    new: nn.Module
    if to in ("fused", "mha"):
        new = (FusedBlock if to == "fused" else TransformerBlock).from_config(config)
    elif to == "lesson":
        if block_size is None and isinstance(module, Block):
            block_size = module.block_size
        if block_size is None:
            raise UserValueError(
                "convert(..., 'lesson') needs block_size=N: the lesson's Block fixes its longest "
                "sequence when it is built"
            )
        new, state = _lesson(config, state, check_positive_int("block_size", block_size))
    else:
        new = nn.TransformerEncoderLayer(
            config.d_model,
            config.n_head,
            config.d_ff,
            dropout=config.dropout,
            # The encoder layer takes "relu" and "gelu" by name, any other activation as a
            # function (then it skips its fast path, computing the same function).
            activation=(
                config.activation
                if config.activation in ("relu", "gelu")
                else activation_function(config.activation)
            ),
            layer_norm_eps=config.norm_eps,
            batch_first=True,
            norm_first=True,
            bias=config.bias,
        )
    # Cast before loading: loading float64 values into a float32 module would round them.
    new.to(device=reference.device, dtype=reference.dtype)
    new.load_state_dict(state, strict=True)
    return new.train(module.training)


def describe(module: nn.Module) -> tuple[BlockConfig, State]:
    """Any form's ``BlockConfig`` and weights in ``TransformerBlock``'s layout, not copied.

    The tensors are the block's own parameters (the lesson's q/k/v concatenated, with a zero
    ``in_proj_bias``), so gradients reach the block; a bias-free block has no ``*.bias``.

    Example:
        >>> from gptblock import lesson
        >>> block = lesson.Block(n_embd=16, n_head=2, block_size=8)
        >>> config, state = describe(block)
        >>> config.activation, tuple(state["self_attn.in_proj_weight"].shape)
        ('relu', (48, 16))
        >>> state["linear1.weight"] is block.ffwd.net[0].weight
        True
    """
    if isinstance(module, (TransformerBlock, FusedBlock)):
        # Its parameters by their own names (a LlamaBlock's state_dict is named as Llama's).
        return module.config, dict(module.named_parameters())
    if isinstance(module, nn.TransformerEncoderLayer):
        return _describe_encoder_layer(module)
    if isinstance(module, Block):
        return _describe_lesson(module)
    raise UserTypeError(
        "expected a block: a gptblock.lesson.Block, TransformerBlock, FusedBlock or "
        f"nn.TransformerEncoderLayer, got {type(module).__name__}"
    )


def parts_of(module: nn.Module) -> BlockParts:
    """Any form's parts for ``block_forward`` on its own parameters (``describe``'s): how a form
    whose forward has no KV cache or hook points is run with them.

    Example:
        >>> from gptblock import lesson
        >>> from gptblock.blocks.fused import block_forward
        >>> block = lesson.Block(n_embd=16, n_head=2, block_size=8).eval()
        >>> x = torch.randn(1, 5, 16)
        >>> torch.allclose(block_forward(parts_of(block), x), block(x), atol=1e-6)
        True
    """
    if isinstance(module, FusedBlock):
        return module.parts()
    return BlockParts.of_state(*describe(module))


def _describe_lesson(block: Block) -> tuple[BlockConfig, State]:
    C, nh = block.n_embd, len(block.sa.heads)
    probs = {m.p for m in block.modules() if isinstance(m, nn.Dropout)}
    if len(probs) != 1:
        raise ConversionError(
            f"this lesson Block's dropouts were changed to different probabilities {sorted(probs)}; "
            "the other forms have one dropout probability"
        )
    if block.ln1.eps != block.ln2.eps:
        raise ConversionError(
            f"the LayerNorms have different eps ({block.ln1.eps} and {block.ln2.eps}); "
            "the other forms share one norm_eps"
        )
    config = BlockConfig(C, nh, dropout=probs.pop(), activation="relu", norm_eps=block.ln1.eps)
    own = block.state_dict(keep_vars=True)
    weight = torch.cat([own[key] for key in lesson_qkv_keys(nh)])  # 3 * nh x (hs, C) -> (3C, C)
    # q/k/v: no bias (zeros, not a parameter: nothing to train)
    state: State = {IN_PROJ[0]: weight, IN_PROJ[1]: weight.new_zeros(3 * C)}
    for mine, theirs in LESSON_RENAMES.items():
        for kind in ("weight", "bias"):
            state[f"{theirs}.{kind}"] = own[f"{mine}.{kind}"]
    return config, state


def _describe_encoder_layer(layer: nn.TransformerEncoderLayer) -> tuple[BlockConfig, State]:
    def refuse(why: str) -> ConversionError:
        return ConversionError(f"this nn.TransformerEncoderLayer is not the GPT block: {why}")

    attn = layer.self_attn
    C, nh = attn.embed_dim, attn.num_heads
    if not layer.norm_first:
        raise refuse("it is post-norm (norm_first=False); the block normalises before each branch")
    if not attn.batch_first:
        raise refuse("batch_first=False takes (T, B, C); the block takes (B, T, C)")
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise refuse("its attention has kdim/vdim, add_bias_kv or add_zero_attn")
    if layer.linear1.out_features != 4 * C:
        raise refuse(f"dim_feedforward={layer.linear1.out_features}, the block's is 4 * {C}")
    if layer.norm1.eps != layer.norm2.eps:
        raise refuse(f"its LayerNorms have different eps ({layer.norm1.eps}, {layer.norm2.eps})")
    if not (layer.norm1.elementwise_affine and layer.norm2.elementwise_affine):
        raise refuse("its LayerNorms have no weight (elementwise_affine=False)")
    activation = activation_name(layer.activation)
    if activation is None:
        raise refuse(
            f"activation {layer.activation!r}; the block supports exact GELU, ReLU and tanh GELU"
        )
    probs = {layer.dropout.p, layer.dropout1.p, layer.dropout2.p, attn.dropout}
    if len(probs) != 1:
        raise refuse(f"its dropouts differ ({sorted(probs)}); the block has one probability")
    biases = [attn.in_proj_bias, attn.out_proj.bias, layer.linear1.bias, layer.linear2.bias]
    biases += [layer.norm1.bias, layer.norm2.bias]
    if len({b is None for b in biases}) != 1:
        raise refuse("some of its layers have biases and some do not")
    config = BlockConfig(
        C, nh, dropout=probs.pop(), activation=activation, bias=biases[0] is not None,
        norm_eps=layer.norm1.eps,
    )  # fmt: skip
    return config, layer.state_dict(keep_vars=True)


def _lesson(config: BlockConfig, state: State, block_size: int) -> tuple[Block, State]:
    """A fresh lesson Block and ``state`` in its layout (the packed q/k/v split by head)."""

    def refuse(why: str) -> ConversionError:
        return ConversionError(f"cannot convert to 'lesson': {why}")

    C, nh, hs = config.d_model, config.n_head, config.head_size
    if config.activation != "relu":
        raise refuse(f"the lesson's FeedForward uses ReLU, this block uses {config.activation!r}")
    if config.norm_eps != LESSON_EPS:
        raise refuse(f"the lesson's LayerNorms have eps {LESSON_EPS}, this block {config.norm_eps}")
    in_bias = state.get(IN_PROJ[1])
    if in_bias is not None and bool(in_bias.ne(0).any()):
        raise refuse(
            "the lesson's query/key/value Linears have no bias, and this block's "
            "self_attn.in_proj_bias is nonzero"
        )
    block = Block(C, nh, block_size, dropout=config.dropout)
    # (3C, C) -> 3 * nh row blocks of (hs, C): q of heads 0..nh-1, then k, then v
    rows = state[IN_PROJ[0]].view(3 * nh, hs, C).unbind(0)
    own: State = dict(zip(lesson_qkv_keys(nh), rows, strict=True))
    for i in range(nh):
        own[lesson_head(i) + LESSON_TRIL] = torch.tril(torch.ones(block_size, block_size))
    # A bias-free block (bias=False) computes what zero biases compute: the lesson gets zeros.
    for mine, theirs in LESSON_RENAMES.items():
        weight, bias = state[f"{theirs}.weight"], state.get(f"{theirs}.bias")
        own[f"{mine}.weight"] = weight
        own[f"{mine}.bias"] = bias if bias is not None else weight.new_zeros(weight.shape[0])
    return block, own
