"""The demo: generated scenes of coloured shapes (gallery for the main job, training data later)."""
