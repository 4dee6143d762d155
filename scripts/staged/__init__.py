"""The staged family's own test and benchmark models (instance/staged): the tiny model and the CosyVoice3-0.5B-shaped one."""
