"""Building models: importing real checkpoints and fine-tuning them (not used when serving)."""
