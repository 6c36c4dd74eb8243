"""Building models: everything that makes a model, none of it used when serving.

* ``calendar_data``: the seeded synthetic calendar conversations the models are trained and
  evaluated on, and how their replies are judged (``CHECKER_OPTIONS`` for ``votes.checkers``);
* ``demo_models``: the tiny demo models trained from scratch on that data (tokenizers, the
  training loop, the held-out evaluation, the presets ``build_demo_models`` writes);
* ``checkpoints`` and ``gguf_checkpoint``: importing real pretrained checkpoints as presets;
* ``fixer``: the LoRA fine-tune of an imported model into the fixer, and its preset;
* ``perplexity``: measuring an imported model on held-out text.

The management commands that run them (``build_demo_models``, ``import_checkpoint``,
``finetune_fixer``, ``build_fixer_preset``) stay in ``inference/management/commands``.
"""
