"""Model resolution: a model's name (a tiny preset, a registry model, a ``.gguf`` file, a folder, a
Hugging Face Hub name) to the local Hugging Face folder every engine loads (``resolve``).

``named`` lists the models known by name and the facts defaults scale with (no torch: the researcher
reads it); ``hub`` tells a Hub name from a path and finds or downloads its snapshot in the hub cache
(huggingface_hub, imported only then); ``presets`` with ``tiny`` and ``tiny_bpe`` builds the offline
presets from a seed; ``gguf`` converts a GGUF file once; ``folders`` writes a folder whole or not at
all (also for checkpoints and published weights). Nothing here imports an engine; torch and
transformers only when a preset is built or a file converted.
"""
