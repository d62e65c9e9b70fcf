"""The text layer every engine and the server share: a model's tokenizer and chat template
(``templates``: rendering, encoding, decoding, stop strings), reply parsing into tool calls and
reasoning (``parsers``: vLLM's parser names), and drift repair (``drift``: a re-sent conversation
mapped back onto the ids that were sampled for it).

Torch-free: the vLLM engine, whose model lives in another process, uses the very same rules.
"""
