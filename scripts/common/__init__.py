"""Layers and helpers the families share."""
