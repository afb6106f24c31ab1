"""andreactl's commands, one module per family; each declares its :class:`~.conventions.Command`
rows beside the code they run, and :mod:`andrea.control.andreactl` lists the rows in its table.

- :mod:`.status`: ``status``, ``watch``
- :mod:`.trainer_requests`: ``checkpoint``, ``stop``
- :mod:`.pivot`: ``pivot`` (preflight, request, await, commit; ``--cancel``)
- :mod:`.checkpoints`: ``checkpoints``, ``prune``
- :mod:`.history`: ``history``, ``samples``
- :mod:`.observability`: ``plot``, ``metrics``
- :mod:`.tools`: ``size``, ``export``, ``verify-resume``, ``schema``
- :mod:`.tokenizer`: ``tokenizer train``, ``tokenizer encode``
- :mod:`.generate`: ``generate``

Shared by them: :mod:`.conventions` (the row, exit codes, the user error, output), :mod:`.daemons`
(asking a daemon) and :mod:`.formatting` (figures for a person).
"""
