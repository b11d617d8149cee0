"""Training: %fit's loop, mixed precision, batches and cached features."""
