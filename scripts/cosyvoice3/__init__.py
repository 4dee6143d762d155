"""CosyVoice3, served by the staged family (instance/staged)."""
