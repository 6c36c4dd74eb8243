"""Talking to the model hosts: one interface whatever serves the model.

``base`` defines it (a client submits a conversation and returns a ``Generation`` that streams
text deltas); ``local`` is the arena's own keras-hub engine in this process, ``openai_compatible``
any server that speaks the OpenAI chat-completions stream (vLLM, the arena's own
``run_inference_host --serve``, llama.cpp, hosted APIs). Plain modules: no Django, and only
``local`` imports Keras or JAX (lazily).
"""
