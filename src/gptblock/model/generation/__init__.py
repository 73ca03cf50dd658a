"""Generation, in one place: what ``GPT.generate`` and ``GPT.stream`` run.

* ``cache`` -- ``KVCache``: one block's keys and values so far, preallocated.
* ``matvec`` -- ``RowLinear``: a weight laid out for one-position products (a step's matmuls).
* ``weights`` -- ``BFloat16Linear`` and ``Int8Linear``: reduced-precision weights, which a step
  reads faster (``GPT.generate(weights=...)``).
* ``sampling`` -- ``GenerationStep`` and ``sample``: the next token from a step's logits.
* ``decode`` -- ``Decoder`` and ``stream``: the GPT's one forward pass with a cache per block,
  a prompt at once, then a token at a time; and the loop that streams the steps.

Text (a tokenizer's prompt in, pieces of text out) is ``gptblock.sampling``'s, outside the model.
"""
