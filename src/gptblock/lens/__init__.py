"""Looking inside a GPT: named activations and hooks (``trace``), the residual stream read out
(``readout``), all of it for one prompt (``report``), figures (``figures``) and the HTML
attention viewer (``page``); each function's docstring has a runnable example.
"""

from inspect import isfunction

from ..errors import checked
from .figures import (
    FIGURE_FILES,
    attention_figure,
    attribution_figure,
    logit_lens_figure,
    save_figures,
)
from .page import attention_page, save_attention_page
from .readout import (
    HeadSummary,
    LogitAttribution,
    LogitLens,
    attention_entropy,
    direct_logit_attribution,
    head_summaries,
    logit_lens,
    mean_distance_back,
    stream_components,
)
from .report import PromptInspection, inspect_prompt, show_token
from .trace import (
    BLOCK_POINTS,
    ActivationCache,
    CachedRun,
    Hook,
    activation_names,
    run_with_cache,
    run_with_hooks,
)

__all__ = [
    "BLOCK_POINTS",
    "FIGURE_FILES",
    "ActivationCache",
    "CachedRun",
    "HeadSummary",
    "Hook",
    "LogitAttribution",
    "LogitLens",
    "PromptInspection",
    "activation_names",
    "attention_entropy",
    "attention_figure",
    "attention_page",
    "attribution_figure",
    "direct_logit_attribution",
    "head_summaries",
    "inspect_prompt",
    "logit_lens",
    "logit_lens_figure",
    "mean_distance_back",
    "run_with_cache",
    "run_with_hooks",
    "save_attention_page",
    "save_figures",
    "show_token",
    "stream_components",
]

# Each public function refuses an argument of another type than its annotation, naming it.
globals().update(
    {n: checked(f) for n, f in list(globals().items()) if n in __all__ and isfunction(f)}
)
