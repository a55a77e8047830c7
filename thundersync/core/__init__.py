"""The learner core: the ``Learner``, its objectives, event assembly and the exact gradient
strategies (docs/design.md §1, §3). It imports only the protocol (and ``declared`` for the
objectives' fields)."""
