"""`cinq export MODEL --format gguf --outtype bf16|q8_0|q4_0 --out FILE.gguf`: a dense model folder in another
runtime's format (GGUF, which llama.cpp runs). `cinq export FILE.gguf --format hf --out DIR`: a GGUF file as a
dense Hugging Face folder (its values dequantized), for the tools that start from dense weights."""

from __future__ import annotations

import argparse

FORMATS = ("gguf", "hf")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from cinq.export import GGUF_OUTTYPES  # torch-free: the parser stays cheap

    p = subparsers.add_parser("export", help="write a model folder as GGUF (llama.cpp), or a GGUF file as a folder",
                              description=__doc__)
    p.add_argument("model", nargs="?", default=None,
                   help="dense model folder or embedded model, e.g. cinq-tiny (default: the embedded model)")
    p.add_argument("--format", default="gguf", help=f"output format: {', '.join(FORMATS)} (default: %(default)s)")
    p.add_argument("--outtype", default="bf16",
                   help=f"matrix type: {', '.join(GGUF_OUTTYPES)} (default: %(default)s; q4_0 keeps the embedding "
                        f"and output in q8_0; norms are always float32)")
    p.add_argument("--dtype", default="bfloat16", help="--format hf: the folder's weight dtype (default: %(default)s)")
    p.add_argument("--out", required=True, help="the file to write, e.g. model-q4_0.gguf (--format hf: a folder)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from cinq.config import resolve_model
    from cinq.errors import InvalidParameterError
    from cinq.export import GGUF_OUTTYPES
    from cinq.export.gguf import export_gguf

    if args.format not in FORMATS:
        raise InvalidParameterError(f"--format must be one of {', '.join(FORMATS)}, got {args.format!r}", "format")
    if args.outtype not in GGUF_OUTTYPES:
        raise InvalidParameterError(f"--outtype must be one of {', '.join(GGUF_OUTTYPES)}, got {args.outtype!r}",
                                    "outtype")
    import logging
    logging.getLogger("gguf").setLevel(logging.WARNING)  # its per-file INFO lines name the temporary file
    model = resolve_model(args.model, "model")
    if args.format == "hf":
        from cinq.export.hf_folder import gguf_to_folder
        print(f"wrote {gguf_to_folder(model, args.out, args.dtype)} (dense {args.dtype} folder)")
        return 0
    res = export_gguf(model, args.out, args.outtype)
    kept = f"; kept in bf16 (rows not whole blocks): {', '.join(res.kept_bf16)}" if res.kept_bf16 else ""
    print(f"wrote {res.path} ({res.architecture}, {res.outtype}, {len(res.tensor_types)} tensors, "
          f"{res.num_bytes / 2**20:.1f} MiB, tokenizer pre {res.vocab.pre!r}, {res.seconds:.1f} s){kept}")
    return 0
