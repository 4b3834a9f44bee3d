"""Small training scripts that use the checkpoint library."""
