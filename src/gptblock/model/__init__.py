"""The tiny GPT (embeddings -> blocks -> final norm -> head), its generation, its memory estimate."""
