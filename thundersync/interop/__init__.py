"""Interoperability with other harnesses and trainers (the optional extra ``interop``).

``atif``: episodes out as ATIF documents (``thundersync export --format atif``) and ATIF
trajectories in as our events (``load_atif``, ``thundersync verify --trajectories``).
"""
