"""VoxCPM 1.5 (instance/voxcpm)."""
