"""Everything that faces the models, by role.

- The roster, which the rest of the arena uses: ``models`` (``LLM``), ``selectors``, ``admin``,
  ``services`` (``ModelReply``: one reply of a roster model wherever it is served; the roster's
  writes), ``context_budget`` (the arena's own measure of a conversation).
- ``clients``: talking to whatever serves a model, the arena's own engine in this process
  (``local``) or an OpenAI-compatible server (``openai_compatible``).
- ``hosts``: serving models, the engines of one host process (``engines``, ``sharding`` over its
  devices) and the OpenAI-compatible server (``openai_server``). A host needs no Django.
- ``engine``: continuous batching (scheduler, compiled programs, sampling, ``prefix_cache``);
  ``forward``: each family's forward pass; ``streaming``: the single-request decode loop and the
  prompt encoding and incremental text the engine reuses.
- Reading presets: ``registry``, ``tokenizers``, ``chat_templates``; a reply's edges:
  ``reply_edges``; figures: ``metrics``, the benchmarks ``bench`` and ``bench_against``.
- ``building``: making models (the tiny demo models and their data, importing checkpoints, the
  fixer's fine-tune), which nothing here imports when serving.

The bundled demo presets are in ``presets/``, the fixer's trained LoRA weights in ``fixer/``.
"""
