"""The protocol: the events, episode records, trajectories, errors and safe input documents
that environments and the learner share (docs/design.md §1). It imports nothing else of
ThunderSync, and not torch."""
