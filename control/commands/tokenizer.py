"""``andreactl tokenizer train|encode|record``: a run's subword tokenizer, trained offline on its
training documents, token files encoded with it (:mod:`andrea.control.tokenizer_tool`), and the
record of which tokenizer made a token file written elsewhere (docs/data.md)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from andrea.control.commands.conventions import EXIT_OK, Command, UserError, emit


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("train", "encode", "record"),
        help="train: a byte-level BPE on the run's training documents; encode: text or JSON "
        "Lines into a tokens file; record: write FILE.json beside a token file made elsewhere "
        "(nanoGPT's train.bin), saying which tokenizer made it",
    )
    parser.add_argument(
        "--dtype",
        choices=("uint8", "uint16", "uint32"),
        help="record: the type of the file's ids, where nothing else says it (an llm.c header "
        "or a nanoGPT meta.pkl beside it does)",
    )
    train = parser.add_argument_group("train")
    train.add_argument("--vocab-size", type=int, metavar="N", help="ids of the tokenizer")
    train.add_argument(
        "--arm",
        action="append",
        metavar="NAME",
        help="train on this arm's documents (repeatable; default: every text arm of the run)",
    )
    train.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="the token cache to encode the arms into with the new tokenizer (default: the run's "
        "[data] cache_dir, $CACHE_DIRECTORY, or ~/.cache/andrea; give the trainer's --cache-dir)",
    )
    train.add_argument(
        "--no-cache",
        action="store_true",
        help="do not encode the arms into the token cache (the run's first start will)",
    )
    both = parser.add_argument_group("train and encode")
    both.add_argument(
        "--out",
        type=Path,
        help="train: the tokenizer.json to write (default: the run's [data] tokenizer, else "
        "RUN_DIR/tokenizer.json); encode: the tokens file to write (and OUT.json beside it)",
    )
    _encode_arguments(parser.add_argument_group("encode"))


def _encode_arguments(encode: argparse._ArgumentGroup) -> None:
    encode.add_argument(
        "--input",
        dest="inputs",
        action="extend",
        nargs="+",
        metavar="FILE",
        help="text files (one document each), .jsonl/.jsonl.gz/.jsonl.zst files (one per line) "
        "and .parquet files (one per row), encoded in this order; quoted globs are expanded "
        "(repeatable)",
    )
    encode.add_argument(
        "--tokenizer",
        metavar="FILE",
        help='the tokenizer.json to encode with, or "bytes" (default: the run\'s [data] tokenizer)',
    )
    encode.add_argument(
        "--field",
        default="text",
        help="the field of a JSON Lines line (the column of a Parquet file) that holds the text",
    )
    encode.add_argument(
        "--follow-links",
        action="store_true",
        help="read a quoted glob's matches that lead out of its directory through a link "
        "(refused by default: a planted link would put another file's text in the tokens file)",
    )
    encode.add_argument(
        "--max-document-bytes",
        type=int,
        metavar="N",
        help="the longest JSON Lines line read (default: the run's [data] max_document_bytes, "
        "else 64 MiB)",
    )


def cmd_tokenizer(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Train the run's tokenizer, or encode files into a tokens file."""
    if args.action == "train":
        return _train(args, parser)
    if args.action == "record":
        return _record(args, parser)
    if args.dtype is not None:
        parser.error("--dtype is an option of record")
    return _encode(args, parser)


def _record(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.vocab_size is not None or args.arm or args.out is not None or args.field != "text":
        parser.error("record takes --input FILE and --tokenizer FILE|bytes (or --run-dir), --dtype")
    if not args.inputs or len(args.inputs) != 1:
        parser.error("record needs one --input FILE: the token file to write the record of")
    from andrea.control import tokenizer_tool as tool
    from andrea.daemon.config import ConfigError
    from andrea.daemon.data.sources import DataError
    from andrea.daemon.data.token_files import record_existing
    from andrea.daemon.data.tokenizer import load_tokenizer

    try:
        if args.tokenizer is not None:
            tokenizer = load_tokenizer(args.tokenizer, Path.cwd())
        elif args.run_dir is not None:
            tokenizer = load_tokenizer(tool.run_config(args.run_dir).data.tokenizer, args.run_dir)
        else:
            parser.error("record needs --tokenizer FILE|bytes, or --run-dir DIR for its tokenizer")
        path = Path(args.inputs[0])
        record = record_existing(path, tokenizer, args.dtype)
    except (ConfigError, DataError) as e:
        raise UserError(str(e)) from None
    text = (
        f"{path}.json: {path} holds {record.tokens:,} tokens ({record.dtype}) made by "
        f"{tokenizer.describe()}"
    )
    emit(args, record, text)
    return EXIT_OK


def _train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.inputs or args.tokenizer or args.follow_links or args.max_document_bytes is not None:
        parser.error(
            "train takes no --input, --tokenizer, --follow-links or --max-document-bytes: it "
            'trains on the run\'s own arms, under its run.toml (an arm says links = "follow")'
        )
    if args.run_dir is None or args.vocab_size is None:
        parser.error("train needs --run-dir DIR and --vocab-size N")
    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir}: no such run directory")
    from andrea.control import tokenizer_tool as tool

    report = tool.train(
        args.run_dir,
        args.vocab_size,
        args.arm,
        args.out,
        progress=sys.stderr.isatty(),
        cache_dir=args.cache_dir,
        warm=not args.no_cache,
    )
    cfg_tokenizer = tool.run_config(args.run_dir).data.tokenizer
    emit(args, report, tool.train_text(report, args.run_dir, cfg_tokenizer))
    return EXIT_OK


def _encode(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.vocab_size is not None or args.arm or args.cache_dir or args.no_cache:
        parser.error("--vocab-size, --arm, --cache-dir and --no-cache are options of train")
    if not args.inputs or args.out is None:
        parser.error("encode needs --input FILE... and --out FILE")
    from andrea.control import tokenizer_tool as tool
    from andrea.daemon.config import DEFAULT_MAX_DOCUMENT_BYTES, ConfigError
    from andrea.daemon.data.tokenizer import load_tokenizer

    files = tool.input_files(args.inputs, args.follow_links)
    bound = DEFAULT_MAX_DOCUMENT_BYTES
    try:
        data = tool.run_config(args.run_dir).data if args.run_dir is not None else None
        if args.tokenizer is not None:
            tokenizer = load_tokenizer(args.tokenizer, Path.cwd())
        elif data is not None:
            tokenizer = load_tokenizer(data.tokenizer, args.run_dir)
        else:
            parser.error("encode needs --tokenizer FILE, or --run-dir DIR for the run's tokenizer")
    except ConfigError as e:
        raise UserError(str(e)) from None
    if args.max_document_bytes is not None:
        if not 1 << 10 <= args.max_document_bytes <= 1 << 36:
            raise UserError(f"--max-document-bytes {args.max_document_bytes}: 1,024..{1 << 36:,}")
        bound = args.max_document_bytes
    elif data is not None:
        bound = data.document_bound
    report = tool.encode(files, args.out, tokenizer, args.field, bound)
    emit(args, report, tool.encode_text(report, _arm_name(args.out), args.run_dir))
    return EXIT_OK


def _arm_name(out: Path) -> str:
    """A name for the arm of a tokens file: its name without the suffix, in the arms' alphabet."""
    stem = out.name.split(".")[0] or "tokens"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:64]


TOKENIZER = Command(
    "tokenizer",
    "train the run's subword tokenizer, or encode text and JSON Lines into a tokens file",
    _arguments,
    cmd_tokenizer,
    needs_run_dir=False,
    examples=(
        "andreactl tokenizer train --run-dir runs/r1 --vocab-size 8192",
        "andreactl tokenizer encode --run-dir runs/r1 --input 'data/web/*.jsonl.gz' --out runs/r1/web.u16",
        "andreactl tokenizer encode --tokenizer tokenizer.json --input notes/*.md --out notes.u16",
        "andreactl tokenizer record --tokenizer gpt2/tokenizer.json --input data/train.bin --dtype uint16",
    ),
)
