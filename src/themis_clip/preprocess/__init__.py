"""Turning caller input into model input: images (Pillow) and text (tokenizers)."""
