"""Diagnostics: the doctor's checks over a whole namespace, and compiled-model tracking."""
