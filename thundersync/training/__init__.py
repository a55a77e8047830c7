"""Training: a policy agent on real envs feeding sync, async and streaming learners.

The only learner-side package that imports ``environments``; nothing else in ``thundersync``
imports it except the command line (docs/design.md §1, §4, §5).
"""
