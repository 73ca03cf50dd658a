"""Generation, what ``GPT.generate`` and ``GPT.stream`` run: ``decode`` (``KVCache``, the cached
forward pass and the loop), ``matvec`` (weights laid out for one-position products), ``weights``
(bfloat16 and int8 copies), ``sampling`` (the next token). Text is ``gptblock.sampling``'s."""
