"""Devices and memory: choosing and moving to a device, misplaced tensors, pinned-memory
timing, memory breakdowns and training-step estimates."""
