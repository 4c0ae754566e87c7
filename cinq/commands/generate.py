"""`cinq generate`: complete prompts offline with the batched engine (an ``OfflineEngine``, the offline ``LLM``'s:
its core in its own process by default, engine/protocol.py).

With several prompts or ``-n`` > 1, vLLM's "Processed prompts" progress bar runs on stderr when stderr is a
terminal (``--no-progress``: none). Ctrl-C stops the run after the current engine step and prints every
completion as far as it got (unfinished ones with ``finish_reason=abort``), then exits with 130.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cinq.engine.protocol import OfflineEngine
    from cinq.outputs import RequestOutput
    from cinq.sampling_params import SamplingParams


# JSON leaves these unescaped, yet str.splitlines() (and many JSONL readers) break lines at them.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def json_line(row: dict) -> str:
    """One JSON Lines record: readable non-ASCII text, but no character any reader takes for a line break."""
    text = json.dumps(row, ensure_ascii=False)
    for char, escape in _LINE_BREAKS.items():
        text = text.replace(char, escape)
    return text


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.commands.engine_args import add_engine_args
    from cinq.commands.sampling_args import add_sampling_args
    p = sub.add_parser("generate", help="complete prompts (batched, offline)",
                       description="Complete one or more prompts with the batched engine and print the results. "
                                   "Ctrl-C prints what was generated so far and exits (status 130).")
    add_engine_args(p)
    p.add_argument("-p", "--prompt", action="append", default=None,
                   help="prompt text (repeatable; default: read prompts from stdin, one per line, or a demo prompt)")
    p.add_argument("--prompt-file", default=None, help="file with one prompt per line")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: one on stderr when it is a terminal and there are several "
                        "prompts or -n > 1)")
    add_sampling_args(p, max_tokens=64)
    g = p.add_argument_group("structured outputs (at most one: the output is constrained to it)")
    g.add_argument("--json-schema", metavar="FILE", default=None, help="a JSON schema file the output must match")
    g.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    g.add_argument("--regex", default=None, help="a regular expression the output must match")
    g.add_argument("--choice", action="append", default=None, help="the output is one of these (repeatable)")
    g.add_argument("--grammar", metavar="FILE", default=None, help="an EBNF grammar file (xgrammar's: root ::= ...)")
    p.set_defaults(run=run)


def structured_from_args(args: argparse.Namespace):  # noqa: ANN201 - StructuredOutputsParams | None
    """The constraint the structured-output flags give (None: none); errors name the flag."""
    from cinq.errors import InvalidParameterError
    from cinq.structured.params import StructuredOutputsParams
    given = {name: value for name, value in (("--json-schema", args.json_schema), ("--json-object",
                                             args.json_object or None), ("--regex", args.regex),
                                             ("--choice", args.choice), ("--grammar", args.grammar))
             if value is not None}
    if not given:
        return None
    if len(given) > 1:
        raise InvalidParameterError(f"give only one of {', '.join(given)}", list(given)[1])
    (flag, value), = given.items()
    if flag in ("--json-schema", "--grammar"):
        text = read_flag_file(flag, value)
        if flag == "--grammar":
            kwargs: dict[str, object] = {"grammar": text}
        else:
            try:
                kwargs = {"json": json.loads(text)}
            except ValueError as e:
                raise InvalidParameterError(f"{flag}: {value} is not JSON ({e})", flag) from None
    else:
        kwargs = {flag[2:].replace("-", "_"): value}
    try:
        return StructuredOutputsParams(**kwargs)
    except InvalidParameterError as e:
        raise InvalidParameterError(f"{flag}: {e}", flag) from None


def read_flag_file(flag: str, path: str) -> str:
    """The text of the file a flag names; one line naming the flag when it cannot be read (missing, a folder,
    not UTF-8), instead of a bare "[Errno 2] No such file or directory"."""
    from cinq.errors import InvalidParameterError
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InvalidParameterError(f"{flag}: cannot read {path}: {e.strerror or e}", flag) from None
    except UnicodeDecodeError as e:
        raise InvalidParameterError(f"{flag}: {path} is not UTF-8 text ({e.reason} at byte {e.start})",
                                    flag) from None


def _prompts(args: argparse.Namespace) -> list[str]:
    from cinq.errors import InvalidParameterError
    if args.prompt and args.prompt_file is not None:
        # one would be dropped without a word; which one the user meant is theirs to say
        raise InvalidParameterError("give --prompt or --prompt-file, not both", "prompt_file")
    if args.prompt:
        return args.prompt
    if args.prompt_file is not None:
        text = read_flag_file("--prompt-file", args.prompt_file)
        return [line for line in text.split("\n") if line.strip()]  # \n only, as the lines of a file iterate
    if not sys.stdin.isatty():
        lines = [line.rstrip("\n") for line in sys.stdin if line.strip()]
        if lines:
            return lines
    return ["Once upon a time"]


@dataclass(slots=True)
class Completion:
    """One completion as far as it got."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class Results:
    """Every request's completions so far, merged from the engine's delta outputs: whole when the run ends, as
    far as they got when it is interrupted (which is why the engine is asked for deltas, not final outputs)."""

    def __init__(self, request_ids: list[str], n: int) -> None:
        self.completions = {rid: [Completion(i) for i in range(n)] for rid in request_ids}
        # running totals (the progress bar reads them after every finished completion: no re-summing)
        self.num_prompt_tokens = 0  # of the requests the engine has produced output for
        self.num_tokens = 0
        self._seen: set[str] = set()

    def update(self, out: RequestOutput, replace: bool = False) -> int:
        """Fold one RequestOutput in (``replace``: it carries whole texts, as a failed request's final output
        does); returns how many completions it finished."""
        if out.request_id not in self._seen:
            self._seen.add(out.request_id)
            self.num_prompt_tokens += len(out.prompt_token_ids)
        finished = 0
        for c in out.outputs:
            mine = self.completions[out.request_id][c.index]
            self.num_tokens -= len(mine.token_ids)
            if replace:
                mine.text, mine.token_ids = c.text, list(c.token_ids)
            else:
                mine.text += c.text
                mine.token_ids += c.token_ids
            self.num_tokens += len(mine.token_ids)
            if c.finish_reason is not None and mine.finish_reason is None:
                mine.finish_reason = c.finish_reason
                finished += 1
        return finished

    @property
    def num_finished(self) -> int:
        """Completions that ended by themselves (not aborted)."""
        return sum(c.finish_reason not in (None, "abort") for cs in self.completions.values() for c in cs)

    @property
    def all_finished(self) -> bool:
        return all(c.finish_reason is not None for cs in self.completions.values() for c in cs)

    def abort_unfinished(self) -> None:
        """Mark what did not finish as aborted (vLLM's finish_reason for a request stopped from outside)."""
        for cs in self.completions.values():
            for c in cs:
                c.finish_reason = c.finish_reason or "abort"


class ProgressBar:
    """vLLM's "Processed prompts" bar (tqdm on stderr) with its input / output speed estimates."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm
        self._bar = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True,
                         postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")
        self._t0 = time.perf_counter()

    def update(self, finished: int, results: Results) -> None:
        if not finished:
            return
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        self._bar.postfix = (f"est. speed input: {results.num_prompt_tokens / elapsed:.2f} toks/s, "
                             f"output: {results.num_tokens / elapsed:.2f} toks/s")
        self._bar.update(finished)

    def close(self) -> None:
        self._bar.close()


def show_progress(args: argparse.Namespace, num_completions: int) -> bool:
    """A bar only where someone watches it (stderr is a terminal) and there is more than one thing to count."""
    return not args.no_progress and num_completions > 1 and sys.stderr.isatty()


def run_requests(engine: OfflineEngine, prompts: list[str | list[int]], params: SamplingParams,
                 bar: ProgressBar | None = None) -> tuple[Results, bool]:
    """Run every prompt to the end, or until Ctrl-C; returns the results and whether it was interrupted.
    All prompts are queued first, all or nothing (a bad one raises before anything runs)."""
    from cinq.commands.interrupt import StepInterrupt
    from cinq.sampling_params import OutputKind

    params = params.clone(output_kind=OutputKind.DELTA)
    ids = [f"generate-{i}" for i in range(len(prompts))]
    results = Results(ids, params.n)
    with StepInterrupt() as stop:  # from the first add on: a Ctrl-C while queueing still prints every prompt
        queued: list[str] = []
        try:
            for rid, prompt in zip(ids, prompts):
                if stop.requested:
                    break
                engine.add_request(rid, prompt, params)
                queued.append(rid)
        except ValueError:
            engine.abort_request(queued)
            raise
        try:
            while engine.has_unfinished_requests() and not stop.requested:
                for out in engine.step():
                    finished = results.update(out, replace=out.request_id in engine.failed_requests)
                    if bar is not None:
                        bar.update(finished, results)
        except KeyboardInterrupt:  # a second Ctrl-C inside a step: the engine is not used again
            stop.requested = True
    interrupted = stop.requested and not results.all_finished
    if interrupted:
        results.abort_unfinished()
    return results, interrupted


def run(args: argparse.Namespace) -> int:

    from cinq.commands.engine_args import engine_config_from_args
    from cinq.commands.sampling_args import sampling_params_from_args
    from cinq.engine.protocol import make_llm_engine

    config = engine_config_from_args(args)
    params = sampling_params_from_args(args, structured_outputs=structured_from_args(args))
    prompts = _prompts(args)
    engine = make_llm_engine(config)
    try:
        return _generate(args, engine, prompts, params)
    finally:
        engine.shutdown()  # a core process, tensor-parallel workers


def _generate(args: argparse.Namespace, engine: OfflineEngine, prompts: list[str], params: SamplingParams) -> int:
    config = engine.config
    inputs: list[str | list[int]] = list(prompts)
    if args.chat:
        tok = engine.tokenizer
        inputs = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False)
                  for p in prompts]
    total = len(prompts) * params.n
    bar = ProgressBar(total, "Processed prompts" if params.n == 1 else "Completions") \
        if show_progress(args, total) else None
    t0 = time.perf_counter()
    try:
        results, interrupted = run_requests(engine, inputs, params, bar)
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - t0
    for prompt, completions in zip(prompts, results.completions.values()):
        for c in completions:
            if args.json:
                print(json_line({"prompt": prompt, "index": c.index, "text": c.text,
                                 "num_tokens": len(c.token_ids), "finish_reason": c.finish_reason}))
            else:
                print(f"--- prompt: {prompt!r}" + (f" [{c.index}]" if len(completions) > 1 else ""))
                print(prompt + c.text if not args.chat else c.text)
                print(f"--- ({len(c.token_ids)} tokens, finish_reason={c.finish_reason})")
    ntok = results.num_tokens
    rate = f"{ntok} tokens in {elapsed:.2f}s ({ntok / max(elapsed, 1e-9):.1f} tok/s)"
    if interrupted:
        print(f"cinq generate: interrupted: {results.num_finished} of {total} completion(s) "
              f"finished, {rate}; the others are shown as far as they got (finish_reason=abort)",
              file=sys.stderr)
        return 130
    print(f"{len(prompts)} prompt(s), {rate} on {config.model}", file=sys.stderr)
    return 0
