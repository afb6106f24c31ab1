"""``andreactl generate``: text from a run's checkpoint or an export folder
(:mod:`andrea.control.generate`), streamed on a terminal, read-only."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from andrea.control import reports
from andrea.control.commands.conventions import EXIT_OK, Command, UserError, emit
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded
from andrea.daemon.rundir.layout import RUN_DIR_ENV

if TYPE_CHECKING:
    from andrea.daemon.data.tokenizer import RunTokenizer

#: The largest prompt file read.
MAX_PROMPT_BYTES = 16 << 20
#: The most --threads accepted (a typo's 10,000 threads would only thrash).
MAX_THREADS = 1024


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--export-dir",
        type=Path,
        help="an export folder (andreactl export, either --format) instead of --run-dir",
    )
    parser.add_argument(
        "--step", type=int, help="with --run-dir: this checkpoint (default: the newest intact one)"
    )
    parser.add_argument(
        "--prompt", action="append", default=[], help="a prompt (repeatable: one text each)"
    )
    parser.add_argument(
        "--prompt-file",
        type=Path,
        action="append",
        default=[],
        help="a UTF-8 file whose whole text is one prompt (repeatable)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="tokens to generate (at most 65,536)"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.8, help="softmax temperature; 0: greedy"
    )
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens only")
    parser.add_argument(
        "--top-p", type=float, help="sample among the most likely tokens of this total mass only"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1337,
        help="the sampling seed, 0 to 2**63 - 1: the same seed, the same text",
    )
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU threads torch computes on (default: torch's, one per core); 1 or 2 beside a "
        "trainer on the same machine, which the default would slow down",
    )


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = []
    for i, text in enumerate(args.prompt, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            # The shell passed bytes that are not UTF-8: a tokenizer reads text, and so does --json.
            raise UserError(
                f"--prompt {i}: not UTF-8 text (byte {len(text[: exc.start].encode())} of the "
                "argument); give UTF-8, "
                "or the bytes in a file read as UTF-8 with --prompt-file"
            ) from None
        prompts.append(text)
    for path in args.prompt_file:
        try:
            raw = read_bounded(path, MAX_PROMPT_BYTES)
        except (FileRejected, OSError) as exc:
            raise UserError(f"--prompt-file {path}: cannot be read: {exc}") from None
        try:
            prompts.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise UserError(f"--prompt-file {path}: not UTF-8 text ({exc.reason})") from None
    if not prompts:
        raise UserError("give a prompt: --prompt TEXT or --prompt-file FILE")
    for i, p in enumerate(prompts, 1):
        if not p:
            raise UserError(f"prompt {i} is empty: a continuation needs at least one token")
    return prompts


def _source(args: argparse.Namespace) -> Path:
    run_dir = args.run_dir
    if run_dir is None and args.export_dir is None and os.environ.get(RUN_DIR_ENV):
        run_dir = Path(os.environ[RUN_DIR_ENV])
    if (run_dir is None) == (args.export_dir is None):
        raise UserError("give one of --run-dir RUN or --export-dir FOLDER")
    if args.export_dir is not None and args.step is not None:
        raise UserError("--step chooses a run's checkpoint; an export holds one")
    folder = run_dir if run_dir is not None else args.export_dir
    if not folder.is_dir():
        raise UserError(f"{folder}: no such directory")
    return folder


def _encode(tok: RunTokenizer, i: int, prompt: str) -> list[int]:
    """The prompt's ids; UserError when the tokenizer makes none of it (a tokenizer that drops
    whitespace, given only spaces): a continuation needs one token to continue."""
    ids = tok.encode(prompt)
    if not ids:
        raise UserError(
            f"prompt {i} ({len(prompt)} characters) encodes to no token with {tok.describe()}: "
            "a continuation needs at least one"
        )
    return ids


class _Stream:
    """Prints a continuation as it grows, whole characters only (a token may end mid-character)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.shown = 0

    def __call__(self, ids: list[int]) -> None:
        text = self.decode(ids)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[self.shown :])
        sys.stdout.flush()
        self.shown = len(text)

    def finish(self, text: str) -> None:
        sys.stdout.write(text[self.shown :] + "\n")
        sys.stdout.flush()


def cmd_generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Load the checkpoint, then continue each prompt."""
    from andrea.control.generate import GenerateError, Sampling, generate_ids, load_source

    folder, prompts = _source(args), _prompts(args)
    sampling = Sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
    if args.threads is not None:
        if not 1 <= args.threads <= MAX_THREADS:
            raise UserError(f"--threads is {args.threads}: 1 to {MAX_THREADS:,}")
        import torch

        torch.set_num_threads(args.threads)
    try:
        sampling.check()
        loaded = load_source(folder, args.step, args.device)
    except GenerateError as exc:
        raise UserError(str(exc)) from None
    tok, block = loaded.tokenizer, loaded.model.cfg.block_size
    for reason in loaded.skipped:
        print(f"WARNING: skipped damaged checkpoint {reason}", file=sys.stderr)
    print(f"{loaded.source}: {tok.describe()}, window {block} tokens", file=sys.stderr)
    encoded = [_encode(tok, i, p) for i, p in enumerate(prompts, 1)]
    stream = not args.json and sys.stdout.isatty()
    outputs = []
    for i, (prompt, ids) in enumerate(zip(prompts, encoded, strict=True), 1):
        if len(ids) > block:
            print(f"prompt {i} has {len(ids)} tokens, more than the window of {block}: the model "
                  f"sees its last {block}", file=sys.stderr)  # fmt: skip
        elif len(ids) + sampling.max_new_tokens > block:
            print(f"prompt {i}: {len(ids)} + {sampling.max_new_tokens} tokens exceed the window "
                  f"of {block}: past it the window slides (the oldest tokens drop out of view)",
                  file=sys.stderr)  # fmt: skip
        if not args.json:
            print(f"--- prompt {i} ---\n{prompt}", end="", flush=True)
        shower = _Stream(tok.decode) if stream else None
        new = generate_ids(loaded, ids, sampling, shower, stop=tok.end_of_document)
        text = tok.decode(new)
        if shower is not None:
            shower.finish(text)
        elif not args.json:
            print(text)
        slid = len(ids) + len(new) > block
        outputs.append(reports.Generation(prompt=prompt, prompt_tokens=len(ids), text=text, tokens=new,
                                    window_slid=slid))  # fmt: skip
    if args.json:
        report = reports.GenerateReport(
            source=str(folder),
            step=loaded.manifest.step,
            tokenizer=tok.identity,
            block_size=block,
            seed=sampling.seed,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            max_new_tokens=sampling.max_new_tokens,
            outputs=outputs,
        )
        emit(args, report, "")
    return EXIT_OK


GENERATE = Command(
    "generate",
    "text from a run's checkpoint or an export folder (read-only; the same --seed, the same text)",
    _arguments,
    cmd_generate,
    needs_run_dir=False,
    examples=(
        'andreactl generate --run-dir runs/r1 --prompt "def main(" --max-new-tokens 64',
        "andreactl generate --export-dir exports/r1 --prompt-file p.txt --temperature 0",
        'andreactl generate --run-dir runs/r1 --step 1000 --prompt "The " --top-k 40 --seed 7',
    ),
)
