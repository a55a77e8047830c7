"""Interoperability with other harnesses and trainers (the optional extra ``interop``).

``atif``: episodes out as ATIF documents (``thundersync export --format atif``) and ATIF
trajectories in as our events (``load_atif``, ``thundersync verify --trajectories``).
``trl``: any registered env as a TRL ``environment_factory`` (``trl_environment``), so TRL's
``GRPOTrainer`` trains on it through our sandboxes and graders.
``openenv_*``: any registered env served as an OpenEnv environment (``thundersync serve``), and
a running OpenEnv server as the env ``openenv/Remote-v0`` (``url=``).
"""
