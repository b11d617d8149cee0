"""Diagnostics: the doctor (its checks in ``checks/``, one module per group, registered
by decorator), what it reads from the data, and compiled-model tracking."""
