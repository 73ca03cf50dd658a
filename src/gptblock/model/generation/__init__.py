"""Generation, what ``GPT.generate`` and ``GPT.stream`` run: ``cache`` (``KVCache``), ``matvec``
(weights laid out for one-position products), ``weights`` (bfloat16 and int8 copies),
``sampling`` (the next token) and ``decode`` (the cached forward pass and the loop). Text in and
out is ``gptblock.sampling``'s."""
