"""Tests of environments.terminal_bench."""
