"""The proof of a pass, shared by the benchmark suites' strict grading (docs/grading.md,
principle 4): the witness that watches a verifier's test run from the interpreter's start
(``witness``, which uploads ``_thundersync_witness.py`` and its start-up hook into the grading
sandbox) and the reference run each suite proves a pass against (``reference``)."""
