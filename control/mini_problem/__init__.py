"""The mini resume-verification problem: a tiny training run whose stop and resume can be proved exact.

Twenty-four synthetic rows (two inputs, one target), a 33-parameter network with dropout, batches of
four rows, Adam and StepLR, on the CPU in float64 with one thread. Three random generators shape the
trajectory: Python ``random`` draws a small gain applied to each batch's inputs, a NumPy PCG64
``Generator`` draws the target noise and the per-epoch shuffles, and torch draws the dropout masks.
Five updates stop mid-epoch (cursor 20 of 24); ten cross into a second shuffle. A resume is exact only
if the checkpoint restores all of it: weights, Adam's moments, the scheduler, the three generators and
the data order with its cursor.

``python -m andrea.control.mini_problem train ...`` runs one path (:mod:`.cli`);
``andrea.control.verify_resume`` runs the paths in fresh processes and compares them.

The package, from the ground up: :mod:`.schema` (file names, formats and every record that crosses a
file), :mod:`.experiment` (data, model, generators, one training run), :mod:`.identity` (config, code
version, data identity, versions), :mod:`.validation` (what a checkpoint must satisfy),
:mod:`.checkpoint` (writing and loading the file), :mod:`.run` (one path: train, checkpoint,
summarise) and :mod:`.cli`. The code version hashes every module of the package.
"""

from andrea.control.mini_problem.checkpoint import load_checkpoint, save_checkpoint
from andrea.control.mini_problem.experiment import (
    build_model,
    build_optimizer,
    build_scheduler,
    make_dataset,
)
from andrea.control.mini_problem.identity import (
    code_version,
    current_identity,
    data_identity,
    source_files,
)
from andrea.control.mini_problem.run import train
from andrea.control.mini_problem.schema import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    SABOTAGES,
    SUMMARY_FORMAT,
    SUMMARY_NAME,
    CheckpointError,
    CheckpointInfo,
    Identity,
    LoadedCheckpoint,
    MiniConfig,
    MiniSummary,
    Refused,
    ResumeInfo,
)
from andrea.control.verify_options import (
    SCHEDULER_AFTER_OPTIMIZER,
    SKIP_DATA_CURSOR,
    SKIP_NUMPY_RNG,
    SKIP_OPTIMIZER_STATE,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_NAME",
    "SABOTAGES",
    "SCHEDULER_AFTER_OPTIMIZER",
    "SKIP_DATA_CURSOR",
    "SKIP_NUMPY_RNG",
    "SKIP_OPTIMIZER_STATE",
    "SUMMARY_FORMAT",
    "SUMMARY_NAME",
    "CheckpointError",
    "CheckpointInfo",
    "Identity",
    "LoadedCheckpoint",
    "MiniConfig",
    "MiniSummary",
    "Refused",
    "ResumeInfo",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "code_version",
    "current_identity",
    "data_identity",
    "load_checkpoint",
    "make_dataset",
    "save_checkpoint",
    "source_files",
    "train",
]
