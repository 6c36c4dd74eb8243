"""Serving the models: everything an inference host or the web process runs.

At this level: the model roster (``models``, ``selectors``, ``admin``), reading presets
(``registry``, ``tokenizers``, ``chat_templates``), the engine (``engine``, ``forward``,
``prefix_cache``, ``sharding``, ``streaming``), an inference host (``hosting``, ``tasks``,
``priority``), the path of a reply to the voter (``dispatch``, ``services``, ``pacing``,
``reply_edges``, ``publisher``, ``relay``) and the engine benchmark (``bench``). The bundled
demo presets are in ``presets/``, the fixer's trained LoRA weights in ``fixer/``.

Making models (the tiny demo models and their data, importing checkpoints, the fixer's
fine-tune) is in ``inference.building``, which nothing here imports when serving.
"""
