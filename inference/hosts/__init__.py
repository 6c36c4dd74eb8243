"""Serving the arena's own keras-hub models to whoever asks: ``openai_server`` speaks the
OpenAI-compatible protocol that every model client of the arena speaks. No Django."""
