"""Building models: everything that makes a model, none of it used when serving.

* ``calendar_data``: the seeded synthetic calendar conversations the demo models are trained and
  evaluated on, and how their replies are judged (``CHECKER_OPTIONS`` for ``votes.checkers``);
* ``dialog_data``: whole seed-shaped dialogs with mistakes, three kinds of correction and false
  corrections, for the fine-tuned contestants, with held-out items disjoint by construction;
* ``demo_models``: the tiny demo models trained from scratch on that data (tokenizers, the
  training loop, the held-out evaluation, the presets ``build_demo_models`` writes);
* ``checkpoints`` and ``gguf_checkpoint``: importing real pretrained checkpoints as presets;
* ``fixer``: the LoRA fine-tunes of imported models into the arena's fine-tuned contestants,
  their presets and their held-out evaluation;
* ``perplexity``: measuring an imported model on held-out text.

The management commands that run them (``build_demo_models``, ``import_checkpoint``,
``finetune_fixer``, ``build_fixer_preset``) stay in ``inference/management/commands``.
"""
