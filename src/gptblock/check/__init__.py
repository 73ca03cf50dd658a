"""The checker behind ``gptblock check``: ``check_block`` says what is wrong with a block.

Which file owns what:

* ``run`` -- ``check_block``: the block in this process (trusted code) or in a child process.
* ``verdict`` -- ``decide``: from the block's answers alone, run the probes, have its parts read,
  compare with the steps, confirm the match on fresh inputs, combine the evidence into a
  diagnosis and a verdict.
* ``build`` -- the block to check from a module or a class / factory and its arguments (with
  ``COMMON_ARGUMENTS`` filled in), and its width C and longest sequence; ``arguments`` -- what a
  class needs beyond them: a config object built from the arguments, or the ``--arg`` line;
  ``calls`` -- what its ``forward`` needs besides the input (filled alike by builder and runner);
  ``sizes`` -- the sizes the file implies (``--arg``, defaults, module settings) and another set,
  and the two reports combined; ``vary`` -- the block's numbers that are sizes, found by value,
  changed to that other set; ``raised`` -- what the block raised when built or first called,
  at the learner's line.
* ``subject`` -- ``Subject``, the checker's eval-mode float64 copy of the block: every call gets a
  fresh input and returns a copy of the output; a call in float32 runs a float32 copy, and a
  ``train`` call runs it in train mode with every dropout off.
* ``probes`` -- black-box probes that need nothing but a module mapping (B, T, C) to (B, T, C).
* ``trace`` -- one forward pass recorded operator by operator (``loop``'s, read back checked),
  replayed with chosen tensors replaced, or between two of them: torch's operators, never the
  block's code, so it runs wherever the trace is; ``loop`` -- the recorder itself (a
  ``TorchDispatchMode``), ``NoDropout`` and the cache driver, as plain data: standard library
  and torch only, for the process that runs the block; ``decode`` -- a recorded argument and
  operator read back (torch's own operators only), and ``TraceError``.
* ``walks`` -- following a traced tensor through reshapes, slices and scalar factors to where a
  role reads or writes it; ``dataflow`` -- the roles (q, k, v, proj, fc1, fc2) from what the
  tensors do; ``norms`` -- the norms, from what they compute.
* ``weights`` -- ``read_block``: each role's weight read by basis-vector interventions, in the
  lessons' layout, and checked against the traced activations.
* ``readings`` -- which reading the comparison uses: the dataflow's, else the module tree's by
  names and shapes, or as the caller's ``--map`` says; ``suggest`` -- a ``--map`` to offer.
* ``parts`` -- the weight-holding parts of the block (norms, linear layers, raw matrices,
  ``nn.MultiheadAttention``) found in its module tree, what each computes, the order the forward
  pass calls them in.
* ``vocabulary`` -- the names people give each role (``query``, ``c_attn``, ``w_2``, ``ln_1``...).
* ``mapping`` -- the parts given their roles from shapes, names, the forward pass and
  registration order, or as the caller names them (``--map``); ``linears`` scores every
  assignment of the linear layers. The fallback when the dataflow does not show the roles.
* ``given`` -- a role given as a slice and layout of a parameter (``--map
  q=attn.c_attn.weight[:,0:32]:in_out``, ``q=W_Q:in_out`` for (nh, C, hs) per head), checked
  against the role's shape.
* ``steps`` -- the lessons' block computed step by step from those parts, each step replaceable.
* ``variants`` -- the catalogued mistakes as changes to those steps, and their combinations.
* ``search`` -- ``explain``: the smallest set of them that reproduces a block, and its ties.
* ``catalogue`` -- the mistakes the checker can name: title, explanation, fix, lesson line.
* ``report`` -- ``CheckReport`` and ``Finding``, what ``check_block`` returns, as text and JSON,
  and its verdict: ``PASS`` (compared), ``FAIL`` or ``UNVERIFIED``.
* ``target`` -- ``load_target`` and ``parse_argument``: the block named by ``FILE.py:NAME`` or
  ``package.module:NAME`` and its ``NAME=VALUE`` arguments. The only module that imports the
  user's code.
* ``served`` -- ``Served``: the block where it runs, answering the checker's requests (its width,
  outputs, gradients, parameters, its parts read into numbers) as plain data;
  ``plain_readings`` and ``modern_answer``, the readings and the modern outcome as that data.
* ``plain`` -- a reading's sub-layers as numbers (linear weights and biases, the kind, eps, gain
  and bias of each norm), and back as ``Parts`` whose shapes are checked.
* ``provenance`` -- the parameter values the checker gives the block, and the check that the
  weights read back are made of them (and which, and whether a head's are another head's).
* ``conditions`` -- ``hold``: a match held to the reference where a learner runs the block
  (float32, train mode, T up to block_size, B up to 64, a dozen calls in a random order);
  ``accounting`` -- every parameter acts and each head's weights are its own
  (``unused_parameters``).
* ``isolation`` -- ``check_isolated``: the block in child processes that only answer
  requests, every check and reading computed here from their traces (``remote``: the block's
  answers, as claims; ``frames``: JSON and raw tensors, never pickle), with a timeout;
  ``child``: starting (``gptblock.early``: as soon as ``gptblock check`` starts), asking and
  stopping them, under names and an environment that do not name the checker; ``reaper``: the
  supervisor that imports torch, forks them and kills their whole process tree (a script).
* ``worker`` -- the builder: loads and builds the block (at the file's sizes, then at others),
  tells its width and reads it by names; ``runner`` -- the runner, which imports nothing of
  gptblock (a neutral copy of it, ``frames``, ``loop``, ``subject`` and ``raised``): builds the
  block again from the builder's arguments and answers everything that decides the verdict;
  ``sized`` -- the checker's side of that: both sizes, one report.

Imports point one way: each layer below uses only the layers before it (and within a layer, as
said), and nothing imports ``gptblock.cli``:

1. ``catalogue``, ``steps``, ``vocabulary``, ``loop`` and ``decode`` use nothing of gptblock
   (``loop`` falls back on its own ``UserValueError`` outside it);
2. ``report`` uses ``catalogue`` and ``loop``; ``subject``, ``raised`` and ``calls`` use
   ``loop``; ``variants`` uses ``steps``;
3. ``search``, ``trace``, ``parts``, ``arguments`` and ``target`` use ``report`` (``one_line``,
   ``CAUGHT``; ``search`` also ``steps`` and ``variants``); ``sizes`` uses ``report``;
   ``arguments`` and ``vary`` use ``sizes``; ``trace`` also ``loop`` and ``decode``; ``build``
   uses ``arguments``, ``calls``, ``sizes``, ``vary``, ``raised`` and ``subject``;
   ``probes`` uses ``subject``; ``walks`` uses ``trace``,
   ``dataflow`` ``walks``, ``norms`` ``dataflow`` and ``walks``, ``weights`` all three and
   ``steps``; ``linears`` uses ``parts``, ``steps`` and ``vocabulary``, ``mapping`` uses
   ``linears``, ``given`` uses ``parts`` and ``mapping``, ``suggest`` and ``readings`` use
   ``given`` and ``mapping`` (``readings`` also ``weights``);
   ``plain`` uses ``steps``; ``provenance`` and ``frames`` use nothing of gptblock;
   ``conditions`` uses ``gradient`` and ``search``, ``accounting`` ``provenance`` and
   ``subject``;
   ``reaper`` uses nothing but the standard library and torch (it runs as a script);
   ``runner`` uses ``calls``, ``frames``, ``loop``, ``subject`` and ``raised`` only (relative imports,
   so that its copy runs as the package ``serve``);
4. ``served`` uses ``runner``, ``build``, ``readings``, ``plain``, ``subject`` and ``suggest``; ``verdict``
   uses ``probes``, ``readings``, ``plain``, ``provenance``, ``search`` and ``variants``;
   ``remote`` uses ``subject``, ``readings``, ``modern``, ``served`` and ``trace``; ``isolation``
   uses ``child`` (which uses ``gptblock.early``, ``frames``, ``report`` and ``reaper``), ``remote``, ``verdict``,
   ``reaper`` (its ``prctl``), ``sized`` (the check at two sizes, through ``remote`` and
   ``verdict``) and ``target`` (only to validate a spec: it never imports the user's code);
5. ``run`` uses all of the above, and the block forms it checks by default (``lesson``, ``mha``,
   ``fused``); ``worker`` uses ``served``, ``runner``, ``build`` and ``target``.

Shapes: B batch, T time, C channels.
"""

from .build import COMMON_ARGUMENTS, fill_common_arguments
from .catalogue import MISTAKES
from .isolation import DEFAULT_TIMEOUT, check_isolated
from .mapping import ROLES
from .report import CheckReport, Finding
from .run import check_block, own_blocks
from .target import load_target, parse_argument

__all__ = [
    "COMMON_ARGUMENTS",
    "DEFAULT_TIMEOUT",
    "MISTAKES",
    "ROLES",
    "CheckReport",
    "Finding",
    "check_block",
    "check_isolated",
    "fill_common_arguments",
    "load_target",
    "own_blocks",
    "parse_argument",
]
